"""Iterated RLHF against one reward model, on several seeds: ``python -m demo iterate``.

The over-optimisation set-up of the guard study (:mod:`demo.guard_study`): a reward model fitted on few,
noisy labels and PPO with a zero KL coefficient. Per seed two runs of ``rlhf-lit iterate`` from
configs/offline/iterate.yaml (the pretrained stories260K model as SFT policy):

- ``iterated``: T iterations; each labels ``--prompts-per-iteration`` fresh prompts' K samples of the
  current policy with the noisy judge (:func:`noisy_vader`), refits the reward model on every label so
  far and runs PPO for ``--rollouts`` rollouts (``--start``: from SFT, the default, or the current policy);
- ``single``: one iteration (one reward model, fitted on the first labels) and PPO for T x ``--rollouts``
  rollouts: the same policy compute, 1 / T of the labels.

Both are measured by the loop itself on the same held-out prompts: the gold judge (VADER, noise-free),
the proxy (the run's reward model) and the KL to SFT; the iterated run also gives the reward model's
accuracy on each iteration's new samples before and after its refit. ``study.json`` and ``study.md``
hold the table, means +- standard errors over seeds:

    python -m demo iterate --out logs/iterate_study --seeds 0 1 2

Written under ``--out`` (marked by :data:`MARKER`; a rerun resumes each ``rlhf-lit iterate`` where it
stopped): ``seed_<s>/{iterated,single}.yaml`` (the loop configs), ``seed_<s>/{iterated,single}/`` (their
run directories), ``seed_<s>/{iterated,single}.log``, ``study.json``, ``study.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from demo.plan import ROOT
from demo.runner import claim_study, run_logged, run_pool, say
from demo.seeds_report import mean_se
from rlhf_lit.artifacts import write_json_atomically, write_text_atomically
from rlhf_lit.integrity import check_json_file

COMMAND = "python -m demo iterate"
MARKER = ".rlhf-lit-iterate-study.json"
BASE_CONFIG = ROOT / "configs" / "offline" / "iterate.yaml"
GOLD = "rlhf_lit.evaluation.judges:vader"
NOISE = 0.3
"""Standard deviation of the noise :func:`noisy_vader` adds to each VADER score (VADER is in [-1, 1])."""
MEASURED = ("gold", "proxy", "kl", "length", "rm_acc_before", "rm_acc_after", "labelled_pairs")
TINY_RM = [
    "--trainer.max_epochs",
    "1",
    "--trainer.max_steps",
    "2",
    "--data.init_args.batch_size",
    "2",
    "--data.init_args.val_fraction",
    "0.34",
]
TINY_PPO = [
    "--model.init_args.sampling.max_new_tokens",
    "8",
    "--model.init_args.ppo.epochs",
    "1",
    "--model.init_args.ppo.minibatch_size",
    "2",
    "--data.init_args.batch_size",
    "4",
]


def noisy_vader(texts: Sequence[str]) -> list[float]:
    """VADER plus Gaussian noise of std :data:`NOISE`, drawn from the text's CRC32: one text, one score
    (a labeller that errs, the same way every time it sees a response): the labeller of the study."""
    import random

    from rlhf_lit.evaluation.judges import vader

    return [s + random.Random(zlib.crc32(t.encode("utf-8"))).gauss(0.0, NOISE) for s, t in zip(vader(texts), texts)]


def loop_config(args: argparse.Namespace, seed: int, run_dir: Path, iterations: int, rollouts: int) -> dict:
    """The ``rlhf-lit iterate`` config of one run: configs/offline/iterate.yaml with the study's settings."""
    config = yaml.safe_load(BASE_CONFIG.read_text(encoding="utf-8"))
    config.update(
        run_dir=str(run_dir),
        iterations=iterations,
        seed=seed,
        labeler={"kind": "judge", "source": "demo.iterate_study:noisy_vader"},
        evaluation={"judge": GOLD},
    )
    config["prompts"].update(held_out=args.held_out, per_iteration=args.prompts_per_iteration)
    for key in ("reward_model", "ppo", "prompts"):  # the shipped configs' paths, from wherever this runs
        path = Path(config[key]["config" if key != "prompts" else "path"])
        config[key]["config" if key != "prompts" else "path"] = str(ROOT / path)
    config["sft_model"] = str(ROOT / config["sft_model"])
    config["ppo"].update(
        start=args.start,
        options=[
            "--model.init_args.kl.kind",
            "fixed",
            "--model.init_args.kl.init_coef",
            str(args.kl_coef),
            "--model.init_args.max_rollouts",
            str(rollouts),
            "--data.init_args.train_path",
            config["prompts"]["path"],
            *(TINY_PPO if args.tiny else []),
        ],
    )
    config["reward_model"]["options"] = TINY_RM if args.tiny else []
    return config


def run_seed(args: argparse.Namespace, out: Path, seed: int) -> dict:
    """Both runs of one seed (each resumed where it stopped); ``{"seed", "iterated": rows, "single": rows}``."""
    result: dict = {"seed": seed}
    for name, iterations, rollouts in (
        ("iterated", args.iterations, args.rollouts),
        ("single", 1, args.iterations * args.rollouts),
    ):
        folder = out / f"seed_{seed}"
        folder.mkdir(parents=True, exist_ok=True)
        config = folder / f"{name}.yaml"
        write_text_atomically(
            config, yaml.safe_dump(loop_config(args, seed, folder / name, iterations, rollouts), sort_keys=False)
        )
        say(f"seed {seed}: {name} ({iterations} iteration(s), {rollouts} rollouts each)")
        run_logged(
            [sys.executable, "-m", "rlhf_lit.cli", "iterate", "--config", str(config)],
            folder / f"{name}.log",
            f"seed {seed} {name}",
        )
        result[name] = check_json_file(folder / name / "summary.json")["rows"]
    return result


def summarise(results: Sequence[Mapping]) -> dict:
    """Per row (``iterated`` iteration t, ``single``'s last) each measured value's mean +- standard error over seeds."""
    table = []
    for run, pick in (("iterated", None), ("single", -1)):
        count = len(results[0][run])
        for index in [count - 1] if pick is not None else range(count):
            stats = {}
            for key in MEASURED:
                values = [r[run][index].get(key) for r in results]
                values = [v for v in values if v is not None]
                stats[key] = dict(zip(("mean", "se"), mean_se(values))) if values else None
            table.append({"run": run, "iteration": results[0][run][index]["iteration"], **stats})
    return {"seeds": [r["seed"] for r in results], "rows": table}


def markdown(summary: Mapping, settings: Mapping) -> str:
    """``study.md``: the settings, the command and the table."""

    def cell(stat) -> str:
        """``mean ± se`` (``-`` when not measured)."""
        if stat is None:
            return "-"
        return f"{stat['mean']:.3f}" + ("" if stat["se"] is None else f" ± {stat['se']:.3f}")

    lines = [
        f"Seeds {', '.join(map(str, summary['seeds']))}; {json.dumps(dict(settings))}",
        "",
        f"    {settings['command']}",
        "",
        "| run | iteration | gold (VADER) | proxy (RM) | KL to SFT | length | RM acc. before | RM acc. after | labelled pairs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in summary["rows"]:
        lines.append(
            f"| {row['run']} | {row['iteration']} | "
            + " | ".join(cell(row[k]) for k in MEASURED[:4])
            + " | "
            + " | ".join(cell(row[k]) for k in MEASURED[4:])
            + " |"
        )
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m demo iterate``."""
    p = argparse.ArgumentParser(
        prog=COMMAND, description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--out", required=True, help="the study's folder (created and marked; a rerun resumes)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--iterations", type=int, default=3, help="T of the iterated run")
    p.add_argument("--rollouts", type=int, default=20, help="PPO rollouts per iteration (single: T x this)")
    p.add_argument(
        "--prompts-per-iteration", type=int, default=16, help="fresh prompts labelled per iteration (K = 4 each)"
    )
    p.add_argument("--held-out", type=int, default=64, help="held-out evaluation prompts")
    p.add_argument("--kl-coef", type=float, default=0.0, help="PPO's fixed KL coefficient")
    p.add_argument("--start", choices=["restart", "continue"], default="restart", help="PPO's start each iteration")
    p.add_argument("--jobs", type=int, default=1, help="seeds at a time")
    p.add_argument("--tiny", action="store_true", help="a smoke run: 1-2 steps per stage")
    return p


def main(argv: Sequence[str]) -> int:
    """Run the study; returns the exit status."""
    args = build_parser().parse_args(list(argv))
    if args.tiny:
        args.iterations, args.rollouts, args.prompts_per_iteration, args.held_out = 2, 1, 4, 2
    out = Path(args.out)
    claim_study(out, MARKER, COMMAND)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "jobs")} | {
        "noise": NOISE,
        "command": " ".join([COMMAND, *argv]),
    }
    results = run_pool(lambda seed: run_seed(args, out, seed), args.seeds, args.jobs)
    summary = summarise(results)
    write_json_atomically(out / "study.json", {"settings": settings, **summary, "per_seed": results})
    write_text_atomically(out / "study.md", markdown(summary, settings))
    print((out / "study.md").read_text(encoding="utf-8"))
    return 0

"""Over-optimisation made to happen, and the guard watching it: ``python -m demo guard``.

From a finished ``make demo`` folder this trains a *weaker proxy* reward model (a fraction of the
demo's preference pairs, relabelled by the noisy ``bradley_terry`` labeller from the judge scores
the pairs carry) and runs PPO against it with a low or zero KL coefficient for long enough that
the proxy keeps rising while the gold judge (VADER) rises, then stalls or falls (Gao et al. 2022).
Each PPO run carries :class:`~rlhf_lit.callbacks.OverOptimisationGuard` (settings:
:func:`guard_callback`): a held-out evaluation with the judge every ``--held-out-every`` rollouts on
prompts of their own (:data:`GUARD_PROMPTS`), ``proxy_gold`` and the other signals, and
``keep_best`` on the held-out judge, so the run *exports* the best held-out policy once a
``keep_best`` signal fired:

    python -m demo guard --demo logs/demo --out logs/guard --seeds 0 1 2

The defaults (32 pairs, temperature 1.0, KL coefficient 0, 70 rollouts) are the setting of
docs/DEMO.md: with stronger proxies the judge did not fall within the run (200 pairs at 0.25: 0.97
by rollout 25 and level; 64 pairs at 0.5: still rising at rollout 80; one seed each).

The same run without ``keep_best`` would export its last policy: training is the same rollout for
rollout (``keep_best`` on a held-out metric only copies weights; the held-out sampling has its own
generator), so the last policy is read from the run's final ``RolloutCheckpoint``. Both policies
are measured with the demo's evaluation (:func:`demo.held_out_eval.evaluate`: 256
held-out prompts, judge score and KL to SFT).

Written under ``--out`` (created by this command and marked by :data:`MARKER`; a rerun reuses what
is finished and deletes nothing it did not write):

- ``proxy/``: ``preferences.jsonl`` (the relabelled pairs), the proxy RM's export ``model/``;
- ``ppo_guard.yaml``: the demo PPO config with the guard, the run's config;
- ``seed_<s>/``: TensorBoard logs, ``model/`` (the export: with ``keep_best``), ``last/`` (the last
  policy), their evaluations, ``result.json`` (per-rollout curves, held-out evaluations, the
  rollouts where each signal fired, the kept rollout);
- ``study.json``, ``study.md`` and ``guard.png`` (:mod:`demo.guard_report`).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Sequence
from pathlib import Path

from demo.plan import ASSETS, ROOT
from demo.runner import (
    claim_study,
    fresh_run,
    held_out_metrics,
    rollout_checkpointing,
    run_logged,
    run_pool,
    seed_overrides,
    tb_logger,
)
from demo.runner import fit_command as rlhf_lit_fit
from rlhf_lit.artifacts import write_text_atomically
from rlhf_lit.integrity import check_json_file, check_jsonl_file

COMMAND = "python -m demo guard"

MARKER = ".rlhf-lit-guard-study.json"
"""Written into ``--out`` when this command creates it; a non-empty folder without it is refused."""
RUN_MARKER = ".rlhf-lit-guard-run"
"""Written first into each run's folder: only a folder holding it is cleared to start an unfinished run again."""
GUARD_PROMPTS = (3300, 64)
"""``(first paragraph, count)`` of the guard's held-out prompts: in the demo's spare range, disjoint from
the SFT, preference, PPO and evaluation prompts, so the policy ``keep_best`` picks is measured on prompts
that did not pick it."""
JUDGE = "rlhf_lit.evaluation.judges:vader"
CURVE_TAGS = ("objective/scores", "objective/judge", "objective/kl", "response/length")
"""Per-rollout scalars kept from each run (``objective/scores`` is the proxy's score)."""
SIGNALS = ("proxy_gold", "kl", "length", "distinct", "objective")
"""The guard's signals this study turns on (no ensemble: no ``disagreement``)."""
TINY_PPO = (
    "--data.init_args.batch_size",
    "8",
    "--model.init_args.ppo.minibatch_size",
    "4",
    "--model.init_args.ppo.epochs",
    "1",
    "--model.init_args.sampling.max_new_tokens",
    "16",
)
TINY_RM = (
    "--trainer.max_epochs",
    "1",
    "--data.init_args.batch_size",
    "8",
    "--model.init_args.optimizer.warmup_steps",
    "1",
)


# ------------------------------------------------------------------ the weaker proxy
def relabel(pairs: Sequence[dict], count: int, temperature: float, seed: int) -> list[dict]:
    """``count`` of ``pairs`` (a seeded draw) relabelled by the Bradley-Terry labeller.

    Each pair keeps its two responses; which one is chosen is drawn again from the judge scores it
    carries (``chosen_score``, ``rejected_score``): the first stays chosen with probability
    ``sigmoid((chosen_score - rejected_score) / temperature)``
    (:func:`demo.labeling.prefer_first`, one draw per pair).
    """
    from demo.labeling import prefer_first

    if not 1 <= count <= len(pairs):
        raise ValueError(f"--proxy-pairs {count}: the demo has {len(pairs)} pairs")
    rng = random.Random(seed)
    picked = rng.sample(list(pairs), count)
    out = []
    for pair in picked:
        if prefer_first(pair["chosen_score"], pair["rejected_score"], "bradley_terry", temperature, rng):
            out.append(dict(pair))
        else:
            out.append(
                {
                    **pair,
                    "chosen": pair["rejected"],
                    "rejected": pair["chosen"],
                    "chosen_score": pair["rejected_score"],
                    "rejected_score": pair["chosen_score"],
                }
            )
    return out


def train_proxy(args: argparse.Namespace, demo: Path, out: Path) -> Path:
    """The proxy RM under ``out/proxy`` (trained unless finished); its export folder."""
    folder = out / "proxy"
    model = folder / "model"
    if (folder / "done.json").exists():
        return model
    fresh_run(folder, RUN_MARKER, "proxy", COMMAND)
    pairs = check_jsonl_file(demo / "prefs" / "preferences.jsonl")  # a copy cut short: named, not a traceback
    chosen = relabel(pairs, args.proxy_pairs, args.bt_temperature, args.proxy_seed)
    write_text_atomically(folder / "preferences.jsonl", "".join(json.dumps(p) + "\n" for p in chosen))
    cmd = rlhf_lit_fit(
        ROOT / "configs" / "demo" / "reward_model.yaml",
        [
            "--model.init_args.model",
            str(demo / "sft" / "model"),
            "--model.init_args.export_dir",
            str(model),
            # The demo RM config reads rankings; the proxy's labels are pairs (the weaker signal).
            "--data.init_args.train_path",
            str(folder / "preferences.jsonl"),
            "--data.init_args.format",
            "fields",
            "--data.init_args.fields.ranks",
            "null",
            *tb_logger(folder),
            # The config's 10 warmup steps are more than a few dozen pairs make: a tenth of the steps.
            "--model.init_args.optimizer.warmup_steps",
            str(max(1, rm_steps(len(chosen)) // 10)),
            *(TINY_RM if args.tiny else ()),
        ],
    )
    run_logged(cmd, folder / "log.txt", "the proxy reward model")
    flips = sum(a["chosen"] != b["chosen"] for a, b in zip(chosen, _picked(pairs, args)))
    write_text_atomically(folder / "done.json", json.dumps({"pairs": len(chosen), "flipped": flips}) + "\n")
    return model


def rm_steps(pairs: int, val_fraction: float = 0.1, batch_size: int = 16, epochs: int = 2) -> int:
    """Optimizer steps of the demo RM config on ``pairs`` pairs (its held-out tenth not trained on)."""
    return math.ceil((pairs - math.ceil(pairs * val_fraction)) / batch_size) * epochs


def _picked(pairs: Sequence[dict], args: argparse.Namespace) -> list[dict]:
    return random.Random(args.proxy_seed).sample(list(pairs), args.proxy_pairs)


# ------------------------------------------------------------------ the guarded PPO runs
def guard_callback(prompts: Sequence[str], every: int, kl_rate: float) -> dict:
    """The guard of every run: ``proxy_gold`` on the held-out judge acts with ``keep_best`` (the export is
    the best held-out judge's policy), the other signals warn."""
    return {
        "class_path": "rlhf_lit.callbacks.OverOptimisationGuard",
        "init_args": {
            "proxy_gold": {"action": "keep_best"},
            "kl": {"action": "warn", "max_rate": kl_rate},
            "length": {"action": "warn"},
            "distinct": {"action": "warn"},
            "objective": {"action": "warn"},
            "held_out": {"prompts": list(prompts), "every_n_rollouts": every, "judge": JUDGE},
            "keep_best": {"metric": "guard/held_out/judge"},
        },
    }


def write_config(args: argparse.Namespace, out: Path) -> Path:
    """``out/ppo_guard.yaml``: the demo PPO config with the guard added to its callbacks."""
    import yaml

    from demo.story_prompts import load_prompts

    with open(ROOT / "configs" / "demo" / "ppo.yaml", encoding="utf-8") as f:
        config = yaml.safe_load(f)
    start, count = GUARD_PROMPTS
    _, prompts = load_prompts(args.paragraphs, start, args.held_out_prompts or count, 8)
    config["trainer"]["callbacks"].append(guard_callback(prompts, args.held_out_every, args.kl_rate))
    path = out / "ppo_guard.yaml"
    write_text_atomically(path, yaml.safe_dump(config, sort_keys=False))
    return path


def fit_command(args: argparse.Namespace, config: Path, demo: Path, proxy: Path, seed: int, folder: Path) -> list[str]:
    """``rlhf-lit fit`` of one seed: the proxy as reward, ``--kl-coef``, ``--rollouts``, a checkpoint at the end."""
    return rlhf_lit_fit(
        config,
        [
            "--model.init_args.sft_model",
            str(demo / "sft" / "model"),
            "--model.init_args.reward_model",
            str(proxy),
            "--data.init_args.train_path",
            str(demo / "data" / "ppo.txt"),
            "--model.init_args.kl.kind",
            "fixed",
            "--model.init_args.kl.init_coef",
            f"{args.kl_coef:g}",
            "--model.init_args.max_rollouts",
            str(args.rollouts),
            *rollout_checkpointing(args.rollouts, folder / "checkpoints", keep_all=False),  # one checkpoint: the last
            *tb_logger(folder),
            "--model.init_args.export_dir",
            str(folder / "model"),
            *seed_overrides(seed, rollouts=True),
            *(TINY_PPO if args.tiny else ()),
        ],
    )


def fired(scalars: dict, signal: str) -> list[int]:
    """The rollouts after which ``signal`` acted (``guard/<signal>/acted`` is logged at step rollout - 1)."""
    steps, values = scalars.get(f"guard/{signal}/acted", ([], []))
    return [int(step) + 1 for step, value in zip(steps, values) if value > 0]


def run_seed(args: argparse.Namespace, config: Path, demo: Path, proxy: Path, seed: int, out: Path) -> dict:
    """Train one seed (unless finished), measure the export and the last policy; ``result.json``."""
    folder = out / f"seed_{seed}"
    result_path = folder / "result.json"
    if result_path.exists():
        return check_json_file(result_path, want_object=False)
    from demo.frontier import export_checkpoint_policy
    from demo.report import read_scalars
    from rlhf_lit.models.checkpoint_policy import rollout_checkpoints

    fresh_run(folder, RUN_MARKER, f"seed {seed}", COMMAND)
    log = folder / "log.txt"
    run_logged(fit_command(args, config, demo, proxy, seed, folder), log, f"seed {seed}")
    scalars = read_scalars(str(folder / "tb" / "version_0"))
    checkpoint = rollout_checkpoints(str(folder / "checkpoints"))[args.rollouts]
    last = export_checkpoint_policy(checkpoint, str(demo / "sft" / "model"), str(folder / "last"))
    held_steps, held_judge = scalars.get("guard/held_out/judge", ([], []))
    _, best = scalars.get("guard/best/rollout", ([], []))
    result = {
        "seed": seed,
        "curves": {tag: scalars[tag][1] for tag in CURVE_TAGS if tag in scalars},
        "held_out": {
            "rollouts": [int(s) + 1 for s in held_steps],
            "judge": held_judge,
            "score": scalars.get("guard/held_out/score", ([], []))[1],
        },
        "fired": {signal: fired(scalars, signal) for signal in SIGNALS},
        "kept_rollout": int(best[-1]) if best and fired(scalars, "proxy_gold") else None,
        "exported": _evaluate(args, folder / "model", demo, folder / "eval_export.json"),
        "last": _evaluate(args, Path(last), demo, folder / "eval_last.json"),
        "log": str(log),
    }
    write_text_atomically(result_path, json.dumps(result, indent=1))  # written last: the run is finished
    return result


def _evaluate(args: argparse.Namespace, policy: Path, demo: Path, out: Path) -> dict:
    """The demo's held-out evaluation of ``policy`` (:func:`demo.runner.held_out_metrics`, its log beside
    ``out``); its metrics."""
    return held_out_metrics(
        policy,
        demo / "sft" / "model",
        args.paragraphs,
        args.eval_count,
        16 if args.tiny else 48,
        out,
        out.with_suffix(".log"),
    )


def claim(out: Path) -> None:
    """Create ``out`` with :data:`MARKER`, or accept it when it has the marker; refuse any other non-empty folder."""
    claim_study(out, MARKER, COMMAND)


# ------------------------------------------------------------------ the command
def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if not value > 0 or (isinstance(value, float) and math.isinf(value)):
            raise argparse.ArgumentTypeError(f"{text!r}: must be > 0")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    """Options of ``python -m demo guard``."""
    p = argparse.ArgumentParser(
        prog="python -m demo guard",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--demo", required=True, help="a finished `make demo` folder (its sft, prefs and data)")
    p.add_argument("--out", required=True, help="folder for the proxy, the runs and the report")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of the PPO runs")
    p.add_argument(
        "--proxy-pairs", type=_positive(int), default=32, help="demo preference pairs the proxy RM learns from"
    )
    p.add_argument(
        "--bt-temperature",
        type=_positive(float),
        default=1.0,
        help="Bradley-Terry temperature (judge units) of the proxy's labels",
    )
    p.add_argument("--proxy-seed", type=int, default=0, help="seed of the pairs' draw and of their labels")
    p.add_argument("--kl-coef", type=float, default=0.0, help="PPO's fixed KL coefficient")
    p.add_argument("--rollouts", type=_positive(int), default=70, help="PPO rollouts per run")
    p.add_argument(
        "--held-out-every", type=_positive(int), default=5, help="rollouts between the guard's held-out evaluations"
    )
    p.add_argument(
        "--held-out-prompts",
        type=_positive(int),
        default=None,
        help=f"the guard's held-out prompts (default {GUARD_PROMPTS[1]}, from paragraph {GUARD_PROMPTS[0]})",
    )
    p.add_argument("--kl-rate", type=_positive(float), default=0.5, help="the guard's kl.max_rate (nats per rollout)")
    p.add_argument(
        "--paragraphs", default=str(ASSETS / "data" / "tinystories" / "val.txt"), help="the TinyStories stories"
    )
    p.add_argument("--eval-count", type=_positive(int), default=256, help="held-out prompts of the final evaluation")
    p.add_argument("--tiny", action="store_true", help="tiny budgets (a smoke test, not a result)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the study; exit status 2 on a refused folder or a demo folder without what it needs, 1 on a failed stage."""
    from transformers.utils import logging as hf_logging

    from demo.guard_report import write_study

    args = build_parser().parse_args(argv)
    hf_logging.disable_progress_bar()
    demo, out = Path(args.demo), Path(args.out)
    for need in ("sft/model", "data/ppo.txt", "prefs/preferences.jsonl"):
        if not (demo / need).exists():
            print(
                f"error: --demo {demo} has no {need}: run `make demo` (or the pipeline with --out {demo}) first",
                file=sys.stderr,
            )
            return 2
    try:
        claim(out)
        proxy = train_proxy(args, demo, out)
        print(f"[guard] proxy reward model: {proxy}", flush=True)
        config = write_config(args, out)

        def one(seed: int) -> dict:
            result = run_seed(args, config, demo, proxy, seed, out)
            print(f"[guard] seed {seed}: done", flush=True)
            return result

        results = run_pool(one, args.seeds, 1)  # one at a time: each run is one thread
    except FileExistsError as e:  # a folder this command did not write: nothing in it was touched
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # a stage failed: its log says why
        print(f"error: {e}", file=sys.stderr)
        return 1
    report = write_study(results, vars(args) | {"config": str(config)}, str(out))
    print(f"[guard] report: {report}", flush=True)
    return 0

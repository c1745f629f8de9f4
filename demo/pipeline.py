"""The offline demo, end to end: ``python -m demo.pipeline`` (what ``make demo`` runs).

Steers the pretrained 260K-parameter TinyStories Llama toward happier stories (the "sentiment"
task of Ziegler et al. 2019) with VADER standing in for the human labeller, on 2 CPU cores:

1. split     TinyStories paragraphs into disjoint SFT / RM / PPO / eval ranges (``<out>/data``);
2. sft       ``rlhf-lit fit --config configs/demo/sft.yaml``            -> ``<out>/sft/model``;
3. prefs     ``python -m demo preferences`` (K samples per prompt, the judge labels)
             -> ``<out>/prefs/preferences.jsonl`` (best-vs-worst pairs, DPO's data) and, when the
             RM config reads ``format: rankings``, ``<out>/prefs/rankings.jsonl`` (the whole
             ranking of each prompt's samples, the RM's data);
4. reward_model ``rlhf-lit fit --config configs/demo/reward_model.yaml`` -> ``<out>/reward_model/model``;
5. ppo       ``rlhf-lit fit --config configs/demo/ppo.yaml``            -> ``<out>/ppo/model``
             (and ``RolloutCheckpoint`` files along training, ``<out>/ppo/checkpoints``),
   ppo_kl0   the same with the KL coefficient at 0                     -> ``<out>/ppo_kl0/model``,
   dpo_<b>   ``rlhf-lit fit --config configs/demo/dpo.yaml`` on the same preference pairs, one run
             per beta of ``--dpo-betas``                               -> ``<out>/dpo/beta_<b>/model``,
   best_of_n ``rlhf-lit best-of-n``: N = 1 ... 64 SFT samples picked by the RM, on the first 128
             held-out prompts
             -> ``<out>/best_of_n/best_of_n.json``
             (all of them in parallel, one process and one thread each);
6. evaluate  SFT, PPO (and its checkpoints), PPO-KL0 and the DPO policies on the 256 held-out
             prompts: judge score, KL to SFT, distinct-n, length (``<out>/eval/*.json``);
7. report    PNG plots of both PPO runs, the frontier of every method (judge score against KL to
             SFT, ``<out>/report/frontier.png``) and markdown summaries (``<out>/report``).

``--skip-frontier`` leaves out DPO, best-of-N and the PPO checkpoints (stages 1-7 as before).

Every training stage and the preference command run as subprocesses, exactly the commands a user
would type (printed as they start, output in ``<out>/logs/<stage>.log``), each with one thread;
a failing stage stops the pipeline with its exit status and the tail of its log. Evaluation and
the report run in this process. A rerun replaces the outputs of the previous one under ``<out>``:
the pipeline marks a folder it creates with ``.rlhf-lit-demo.json`` and refuses (exit status 2) to
clear a non-empty ``--out`` without that marker, so it never deletes files it did not write.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import get_args

from demo.labeling import Labeler
from demo.pipeline_measure import measure
from demo.plan import (
    ASSETS,
    DEFAULT_DPO_BETAS,
    FULL,
    RESULTS,
    ROOT,
    TINY,
    Budget,
    NotADemoFolder,
    Paths,
    best_of_n_command,
    claim_out,
    dpo_stage,
    parse_betas,
    ppo_rollouts,
    ppo_sampling,
    reward_model_format,
)
from demo.runner import (
    Running,
    StageFailed,
    Timings,
    fit_command,
    rollout_checkpointing,
    run_stages,
    say,
    start_stages,
    stop_stages,
    wait_stages,
)
from demo.summary import format_value, last_scalar, results_table, write_summary
from rlhf_lit.artifacts import write_text_atomically
from rlhf_lit.child_runs import stop_on_signals
from rlhf_lit.evaluation.judges import DEFAULT_JUDGE
from rlhf_lit.integrity import DamagedFile
from rlhf_lit.sources import DamagedSource


def build_parser() -> argparse.ArgumentParser:
    """The pipeline's options."""
    p = argparse.ArgumentParser(
        prog="python -m demo.pipeline", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", default="logs/demo", help="root of every output (default: %(default)s)")
    p.add_argument(
        "--tiny",
        action="store_true",
        help="tiny budgets (a few steps per stage, few prompts): a smoke test, not a result",
    )
    p.add_argument("--skip-kl0", action="store_true", help="skip the second PPO run with KL coefficient 0")
    p.add_argument(
        "--skip-frontier",
        action="store_true",
        help="skip DPO, best-of-N and the PPO checkpoints: no frontier plot (about half the time)",
    )
    p.add_argument(
        "--dpo-betas",
        type=parse_betas,
        default=DEFAULT_DPO_BETAS,
        metavar="B,B,...",
        help="one DPO run per beta, in parallel (default: %(default)s)",
    )
    p.add_argument(
        "--config-dir",
        default=str(ROOT / "configs" / "demo"),
        help="folder with sft.yaml, reward_model.yaml, ppo.yaml (default: the checkout's configs/demo)",
    )
    p.add_argument(
        "--base-model",
        default=str(ASSETS / "models" / "stories260K"),
        help="pretrained model SFT starts from (default: %(default)s)",
    )
    p.add_argument(
        "--paragraphs",
        default=str(ASSETS / "data" / "tinystories" / "val.txt"),
        help="TinyStories paragraphs, blank-line separated (default: %(default)s)",
    )
    p.add_argument(
        "--judge",
        default=DEFAULT_JUDGE,
        help="judge spec 'module:function' of preferences, PPO logging and evaluation (default: %(default)s)",
    )
    p.add_argument(
        "--labeler",
        choices=get_args(Labeler),
        default="argmax",
        help="argmax: the higher judge score wins; bradley_terry: noisy labels (default: %(default)s)",
    )
    p.add_argument(
        "--bt-temperature",
        type=float,
        default=None,
        help="Bradley-Terry temperature in judge units (bradley_terry only; default 0.25)",
    )
    p.add_argument(
        "--samples-per-prompt",
        type=int,
        default=None,
        help="K completions per preference prompt (default 4): DPO pairs the best with the worst, the RM reads their ranking",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of every stage (seed_everything, PPO rollout_seed, preference sampling); "
        "default: the configs' seeds. The evaluation keeps its own fixed seed",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the whole demo; returns the exit status (that of the first failing stage)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        # SIGTERM and SIGINT unwind the run (exit status 143, 130) and stop its running stage.
        with stop_on_signals("the demo", then="run it again to start over"):
            run(args)
    except NotADemoFolder as e:
        print(f"[demo] {e}", file=sys.stderr, flush=True)
        return 2
    except StageFailed as e:
        print(f"[demo] FAILED: {e}", file=sys.stderr, flush=True)
        return e.returncode or 1
    except (DamagedFile, DamagedSource) as e:  # a file an earlier step wrote, damaged since
        print(f"[demo] error: {e} (delete or restore it, then run the demo again)", file=sys.stderr, flush=True)
        return 1
    return 0


def train(args: argparse.Namespace, budget: Budget, paths: Paths, timings: Timings) -> dict:
    """Split, SFT, preferences, then the RM and DPO, then PPO and best-of-N, each stage a subprocess; returns facts for the summary."""
    from demo.story_prompts import RANGES, write_splits

    configs = Path(args.config_dir)
    seed_args = [] if args.seed is None else ["--seed_everything", str(args.seed)]
    logger_root = ["--trainer.logger.init_args.save_dir", str(paths.root)]

    t0 = time.perf_counter()
    splits = write_splits(args.paragraphs, str(paths.dir("data")))
    timings["split"] = time.perf_counter() - t0
    ranges = ", ".join(f"{k} {RANGES[k][0]}-{sum(RANGES[k]) - 1}" for k in splits)
    say(f"split: paragraphs {ranges} -> {paths.dir('data')}")

    run_stages(
        {
            "sft": fit_command(
                configs / "sft.yaml",
                [
                    *logger_root,
                    *seed_args,
                    "--model.init_args.model",
                    args.base_model,
                    "--model.init_args.export_dir",
                    str(paths.model("sft")),
                    "--data.init_args.train_path",
                    splits["sft"],
                    *budget.sft,
                ],
            )
        },
        paths.dir("logs"),
        timings,
    )

    temperature, max_new_tokens = ppo_sampling(configs / "ppo.yaml", budget)
    preferences = paths.dir("prefs") / "preferences.jsonl"
    pref_cmd = [
        sys.executable,
        "-m",
        "demo",
        "preferences",
        "--model",
        str(paths.model("sft")),
        "--out",
        str(preferences),
        "--paragraphs",
        args.paragraphs,
        "--judge",
        args.judge,
        "--samples-per-prompt",
        str(args.samples_per_prompt or budget.samples_per_prompt),
        "--labeler",
        args.labeler,
        "--temperature",
        str(temperature),
        "--max-new-tokens",
        str(max_new_tokens),
    ]
    if args.bt_temperature is not None:
        pref_cmd += ["--bt-temperature", str(args.bt_temperature)]
    # The RM reads what its config's data format reads: pairs, or the rankings of the same samples.
    rm_data = preferences
    if reward_model_format(configs / "reward_model.yaml") == "rankings":
        rm_data = paths.dir("prefs") / "rankings.jsonl"
        pref_cmd += ["--rankings-out", str(rm_data)]
    if budget.pref_prompts is not None:
        pref_cmd += ["--count", str(budget.pref_prompts)]
    if args.seed is not None:
        pref_cmd += ["--seed", str(args.seed)]
    run_stages({"preferences": pref_cmd}, paths.dir("logs"), timings)

    # DPO needs only the SFT model and the pairs: it starts beside the RM and runs on while PPO trains.
    dpo_runs = (
        {}
        if args.skip_frontier
        else {
            dpo_stage(beta): fit_command(
                configs / "dpo.yaml",
                [
                    *logger_root,
                    *seed_args,
                    "--model.init_args.model",
                    str(paths.model("sft")),
                    "--model.init_args.beta",
                    str(beta),
                    "--trainer.logger.init_args.name",
                    dpo_stage(beta),
                    "--model.init_args.export_dir",
                    str(paths.model(dpo_stage(beta))),
                    "--data.init_args.train_path",
                    str(preferences),
                    *budget.dpo,
                ],
            )
            for beta in args.dpo_betas
        }
    )
    background = start_stages(dpo_runs, paths.dir("logs"))
    try:
        return _train_rm_and_ppo(args, budget, paths, timings, splits, preferences, rm_data, background)
    finally:
        stop_stages(background)  # a no-op unless a stage failed: every run was waited for


def _train_rm_and_ppo(
    args: argparse.Namespace,
    budget: Budget,
    paths: Paths,
    timings: Timings,
    splits: dict[str, str],
    preferences: Path,
    rm_data: Path,
    background: Running,
) -> dict:
    """The RM (trained on ``rm_data``), then PPO (and best-of-N) in parallel with the DPO runs of ``background``; waits for all."""
    dpo_stages = list(background)  # wait_stages removes the stages it reaps from `background`
    configs = Path(args.config_dir)
    seed_args = [] if args.seed is None else ["--seed_everything", str(args.seed)]
    logger_root = ["--trainer.logger.init_args.save_dir", str(paths.root)]
    temperature, max_new_tokens = ppo_sampling(configs / "ppo.yaml", budget)
    # The DPO runs of `background` that end while the RM trains are timed to their own exit.
    wait_stages(
        start_stages(
            {
                "reward_model": fit_command(
                    configs / "reward_model.yaml",
                    [
                        *logger_root,
                        *seed_args,
                        "--model.init_args.model",
                        str(paths.model("sft")),
                        "--model.init_args.export_dir",
                        str(paths.model("reward_model")),
                        "--data.init_args.train_path",
                        str(rm_data),
                        *budget.reward_model,
                    ],
                )
            },
            paths.dir("logs"),
        ),
        timings,
        background,
    )
    rm_accuracy = last_scalar(paths.run("reward_model"), "val/accuracy")
    with open(preferences, encoding="utf-8") as f:
        num_pairs = sum(1 for _ in f)
    with open(rm_data, encoding="utf-8") as f:
        rm_records = f"{sum(1 for _ in f)} judge-labelled {'rankings' if rm_data != preferences else 'pairs'}"
    say(f"reward_model: {rm_records}, held-out pair accuracy {format_value(rm_accuracy)}")

    ppo_args = [
        *logger_root,
        *seed_args,
        "--model.init_args.sft_model",
        str(paths.model("sft")),
        "--model.init_args.reward_model",
        str(paths.model("reward_model")),
        "--model.init_args.judge",
        args.judge,
        "--data.init_args.train_path",
        splits["ppo"],
        *budget.ppo,
        *([] if budget.max_new_tokens is None else ["--model.init_args.sampling.max_new_tokens", str(max_new_tokens)]),
        *([] if args.seed is None else ["--model.init_args.rollout_seed", str(args.seed)]),
    ]
    # The frontier's PPO points: the policy every `checkpoint_every` rollouts (weights only, atomic).
    checkpointing = [] if args.skip_frontier else rollout_checkpointing(budget.checkpoint_every, paths.checkpoints)
    ppo_runs = {
        "ppo": fit_command(
            configs / "ppo.yaml", [*ppo_args, *checkpointing, "--model.init_args.export_dir", str(paths.model("ppo"))]
        )
    }
    if not args.skip_kl0:
        # Same config, prompts and seeds; only the KL coefficient differs (and where the run goes).
        ppo_runs["ppo_kl0"] = fit_command(
            configs / "ppo.yaml",
            [
                *ppo_args,
                "--model.init_args.kl.kind",
                "fixed",
                "--model.init_args.kl.init_coef",
                "0",
                "--trainer.logger.init_args.name",
                "ppo_kl0",
                "--model.init_args.export_dir",
                str(paths.model("ppo_kl0")),
            ],
        )
    others = {}
    if not args.skip_frontier:
        others["best_of_n"] = best_of_n_command(args, budget, paths, temperature, max_new_tokens)
    # In parallel with each other and the DPO runs: one process and one thread each.
    wait_stages({**start_stages({**ppo_runs, **others}, paths.dir("logs")), **background}, timings)
    return {
        "policies": list(ppo_runs),
        "dpo": dpo_stages,
        "rm_accuracy": rm_accuracy,
        "ppo_rollouts": ppo_rollouts(configs / "ppo.yaml", budget),
        "num_pairs": num_pairs,
        "rm_records": rm_records,
        "temperature": temperature,
        "max_new_tokens": max_new_tokens,
    }


def run(args: argparse.Namespace) -> dict:
    """The pipeline proper (see the module docstring); returns what it printed, as a dict."""
    t_start = time.perf_counter()
    budget = TINY if args.tiny else FULL
    paths = Paths(Path(args.out).absolute())
    claim_out(paths.root)
    paths.dir("logs").mkdir(parents=True)
    timings = Timings()

    trained = train(args, budget, paths, timings)
    results, report, frontier = measure(args, budget, paths, trained, timings)
    wall = time.perf_counter() - t_start
    timings["total"] = wall
    summary = write_summary(paths, results, trained["rm_accuracy"], trained["rm_records"], report, timings, frontier)

    models = {name: str(paths.model(name)) for name in ("sft", "reward_model", *trained["policies"], *trained["dpo"])}
    outcome = {
        "models": models,
        "preference_pairs": trained["num_pairs"],
        "rm_val_accuracy": trained["rm_accuracy"],
        "report": report,
        "summary": str(summary),
        "metrics": {n: r["metrics"] for n, r in results.items()},
        "timings_s": timings,
        "cpu_s": timings.cpu,
        "tiny": args.tiny,
        "frontier": None if frontier is None else str(paths.dir("report") / "frontier.json"),
    }
    write_text_atomically(paths.root / RESULTS, json.dumps(outcome, indent=1))
    print("", *results_table(results), "", sep="\n")
    if frontier is not None:
        print(*frontier[1], "", sep="\n")
    for name, path in models.items():
        print(f"[demo] {name} model: {path}")
    print(f"[demo] RM held-out pair accuracy: {format_value(trained['rm_accuracy'])} (of {trained['rm_records']})")
    print(f"[demo] report: {report} and {summary}")
    print(f"[demo] TensorBoard: tensorboard --logdir {paths.root}")
    print(
        f"[demo] wall time: {wall:.1f} s ({wall / 60:.1f} min); CPU time of the stages: "
        f"{sum(timings.cpu.values()):.0f} s",
        flush=True,
    )
    return outcome


if __name__ == "__main__":
    sys.exit(main())

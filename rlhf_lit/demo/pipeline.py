"""The offline demo, end to end: ``python -m rlhf_lit.demo.pipeline`` (what ``make demo`` runs).

Steers the pretrained 260K-parameter TinyStories Llama toward happier stories (the "sentiment"
task of Ziegler et al. 2019) with VADER standing in for the human labeller, on 2 CPU cores:

1. split     TinyStories paragraphs into disjoint SFT / RM / PPO / eval ranges (``<out>/data``);
2. sft       ``rlhf-lit fit --config configs/demo/sft.yaml``            -> ``<out>/sft/model``;
3. prefs     ``python -m rlhf_lit.demo preferences`` (K samples per prompt, the judge labels)
             -> ``<out>/prefs/preferences.jsonl``;
4. rm        ``rlhf-lit fit --config configs/demo/rm.yaml``             -> ``<out>/rm/model``;
5. ppo       ``rlhf-lit fit --config configs/demo/ppo.yaml``            -> ``<out>/ppo/model``,
   ppo_kl0   the same with the KL coefficient at 0                     -> ``<out>/ppo_kl0/model``
             (the two PPO runs go in parallel, one process and one thread each);
6. evaluate  SFT, PPO and PPO-KL0 on the 256 held-out prompts: judge score, KL to SFT, distinct-n,
             length (``<out>/eval/*.json``);
7. report    PNG plots of both PPO runs and markdown summaries (``<out>/report``).

Every training stage and the preference command run as subprocesses, exactly the commands a user
would type (printed as they start, output in ``<out>/logs/<stage>.log``), each with one thread;
a failing stage stops the pipeline with its exit status and the tail of its log. Evaluation and
the report run in this process. A rerun replaces the outputs of the previous one under ``<out>``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from rlhf_lit.demo.labeling import Labeler
from rlhf_lit.evaluation.judges import DEFAULT_JUDGE

ROOT = Path(__file__).resolve().parents[2]
"""The project checkout (configs/ lives here); the offline assets are in ``../shared`` beside it."""
ASSETS = ROOT.parent / "shared" / "assets"
STAGE_DIRS = ("data", "logs", "sft", "prefs", "rm", "ppo", "ppo_kl0", "eval", "report")
"""The folders the pipeline writes under ``--out`` (and clears before a run; nothing else)."""
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
"""One thread per process: on tiny models two threads under load were measured 10-50x slower."""


class StageFailed(RuntimeError):
    """A stage's subprocess exited non-zero; ``returncode`` is its exit status."""

    def __init__(self, stage: str, returncode: int, log_path: Path) -> None:
        tail = _tail(log_path, 40)
        super().__init__(f"stage {stage!r} failed with exit status {returncode}; log: {log_path}\n{tail}")
        self.returncode = returncode


@dataclass(frozen=True)
class Budget:
    """How much work each stage does; ``TINY`` is the test budget (the whole run in under a minute).

    Empty override lists mean "as the config says".
    """

    sft: tuple[str, ...] = ()
    rm: tuple[str, ...] = ()
    ppo: tuple[str, ...] = ()
    pref_prompts: int | None = None  # None = the whole RM paragraph range
    samples_per_prompt: int = 4
    eval_prompts: int | None = None  # None = the whole held-out range (256 prompts)
    max_new_tokens: int | None = None  # None = the PPO config's; else PPO, preferences and eval use it


FULL = Budget()
TINY = Budget(
    sft=("--trainer.max_steps", "3", "--trainer.val_check_interval", "3",
         "--data.init_args.max_records", "48", "--model.init_args.optimizer.warmup_steps", "1"),
    rm=("--trainer.max_epochs", "1", "--data.init_args.batch_size", "8",
        "--model.init_args.optimizer.warmup_steps", "1"),
    ppo=("--model.init_args.max_rollouts", "2", "--data.init_args.batch_size", "8",
         "--model.init_args.ppo.minibatch_size", "4", "--model.init_args.ppo.epochs", "1"),
    pref_prompts=32,
    eval_prompts=16,
    max_new_tokens=16,
)  # fmt: skip


@dataclass(frozen=True)
class Paths:
    """Where every artifact of a run goes, under one root."""

    root: Path

    def dir(self, name: str) -> Path:
        """One of :data:`STAGE_DIRS` under the root."""
        if name not in STAGE_DIRS:
            raise ValueError(f"{name!r} is not one of the pipeline's folders {STAGE_DIRS}")
        return self.root / name

    def model(self, stage: str) -> Path:
        """The Hugging Face export of ``stage`` (``sft``, ``rm``, ``ppo``, ``ppo_kl0``)."""
        return self.root / stage / "model"

    def run(self, stage: str) -> Path:
        """The TensorBoard run of ``stage`` (stage folders are cleared first, so it is version_0)."""
        return self.root / stage / "version_0"


def _tail(path: Path, lines: int) -> str:
    try:
        return "".join(path.read_text(encoding="utf-8", errors="replace").splitlines(True)[-lines:])
    except OSError:
        return ""


def _env() -> dict[str, str]:
    return {**os.environ, **THREAD_ENV}


def _say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def _start(stage: str, cmd: list[str], paths: Paths) -> tuple[subprocess.Popen, Path]:
    """Start ``cmd`` with one thread, its output going to ``<out>/logs/<stage>.log``."""
    log_path = paths.dir("logs") / f"{stage}.log"
    _say(f"{stage}: {shlex.join(cmd)}")
    with open(log_path, "w", encoding="utf-8") as f:  # the child keeps its own handle
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=_env())
    return proc, log_path


def run_stages(stages: dict[str, list[str]], paths: Paths, timings: dict[str, float]) -> None:
    """Run the commands of ``stages`` in parallel and wait for all; raise :class:`StageFailed` on any failure.

    Records each stage's wall time (from the common start) in ``timings``. When one fails, the
    others (started here) are stopped: their results would be discarded.
    """
    t0 = time.perf_counter()
    running = {name: _start(name, cmd, paths) for name, cmd in stages.items()}
    failed: tuple[str, int, Path] | None = None
    for name, (proc, log_path) in running.items():
        rc = proc.wait()
        timings[name] = time.perf_counter() - t0
        if rc != 0 and failed is None:
            failed = (name, rc, log_path)
            for other, (p, _) in running.items():
                if other != name and p.poll() is None:
                    p.terminate()
        elif rc == 0:
            _say(f"{name}: done in {timings[name]:.1f} s")
    if failed is not None:
        raise StageFailed(*failed)


def _fit(config: Path, overrides: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "rlhf_lit.cli", "fit", "--config", str(config), *overrides]


def _ppo_sampling(config: Path, budget: Budget) -> tuple[float, int]:
    """``(temperature, max_new_tokens)`` PPO samples with: the evaluation must use the same."""
    import yaml

    with open(config, encoding="utf-8") as f:
        sampling = yaml.safe_load(f)["model"]["init_args"].get("sampling", {})
    temperature = float(sampling.get("temperature", 1.0))
    max_new_tokens = budget.max_new_tokens or int(sampling.get("max_new_tokens", 64))
    return temperature, max_new_tokens


def _last_scalar(run: Path, tag: str) -> float | None:
    from rlhf_lit.demo.report import read_scalars

    values = read_scalars(str(run)).get(tag, ([], []))[1]
    return values[-1] if values else None


def _fmt(value: float | None) -> str:
    return "not logged" if value is None else f"{value:.3f}"


def _results_table(results: dict[str, dict]) -> list[str]:
    """Markdown rows: one per evaluated model."""
    lines = ["| model | judge mean | KL to SFT (nats) | distinct-1 | distinct-2 | length | ended | n |",
             "|---|---|---|---|---|---|---|---|"]
    for name, result in results.items():
        m = result["metrics"]
        lines.append(
            f"| {name} | {m['judge_mean']:.3f} +- {m['judge_std']:.3f} | {m['kl_mean']:.2f} +- {m['kl_std']:.2f} "
            f"| {m['distinct_1']:.3f} | {m['distinct_2']:.3f} | {m['length_mean']:.1f} "
            f"| {m['ended_fraction']:.2f} | {m['num_samples']} |"
        )
    return lines


def _samples_table(results: dict[str, dict], num_examples: int) -> list[str]:
    """Markdown: the first ``num_examples`` held-out prompts and each model's completion (judge score)."""
    from rlhf_lit.demo.report import _cell

    names = list(results)
    lines = ["| # | prompt | " + " | ".join(names) + " |", "|---" * (2 + len(names)) + "|"]
    columns = [results[n]["samples"] for n in names]
    for i in range(min(num_examples, *(len(c) for c in columns))):
        cells = [f"{_cell(c[i]['response'])} ({c[i]['judge']:.2f})" for c in columns]
        lines.append(f"| {i + 1} | {_cell(columns[0][i]['prompt'])} | " + " | ".join(cells) + " |")
    return lines


def write_summary(paths: Paths, results: dict[str, dict], rm_accuracy: float | None, num_pairs: int,
                  report: str, timings: dict[str, float], num_examples: int = 6) -> Path:
    """``<out>/report/summary.md``: the results table, RM accuracy, timings and sample completions."""
    md = ["# Demo summary", "", "Held-out prompts (TinyStories paragraphs 3000-3255), one sample each at the "
          "temperature PPO samples with; KL = sum over response tokens of log pi - log pi_SFT.", "",
          *_results_table(results), "",
          f"Reward model held-out pair accuracy: {_fmt(rm_accuracy)} ({num_pairs} judge-labelled pairs "
          "written; the RM config holds out a seeded fraction)", "",
          "Wall time per stage (s): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()), "",
          f"Plots and before/after tables: [{os.path.basename(report)}]({os.path.basename(report)})", "",
          "## Samples (same prompts)", "", *_samples_table(results, num_examples), ""]
    path = paths.dir("report") / "summary.md"
    path.write_text("\n".join(md), encoding="utf-8")
    return path


def build_parser() -> argparse.ArgumentParser:
    """The pipeline's options."""
    p = argparse.ArgumentParser(prog="python -m rlhf_lit.demo.pipeline", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="logs/demo", help="root of every output (default: %(default)s)")
    p.add_argument("--tiny", action="store_true",
                   help="tiny budgets (a few steps per stage, few prompts): a smoke test, not a result")
    p.add_argument("--skip-kl0", action="store_true", help="skip the second PPO run with KL coefficient 0")
    p.add_argument("--config-dir", default=str(ROOT / "configs" / "demo"),
                   help="folder with sft.yaml, rm.yaml, ppo.yaml (default: the checkout's configs/demo)")
    p.add_argument("--base-model", default=str(ASSETS / "models" / "stories260K"),
                   help="pretrained model SFT starts from (default: %(default)s)")
    p.add_argument("--paragraphs", default=str(ASSETS / "data" / "tinystories" / "val.txt"),
                   help="TinyStories paragraphs, blank-line separated (default: %(default)s)")
    p.add_argument("--judge", default=DEFAULT_JUDGE,
                   help="judge spec 'module:function' of preferences, PPO logging and evaluation "
                        "(default: %(default)s)")
    p.add_argument("--labeler", choices=get_args(Labeler), default="argmax",
                   help="argmax: the higher judge score wins; bradley_terry: noisy labels (default: %(default)s)")
    p.add_argument("--bt-temperature", type=float, default=None,
                   help="Bradley-Terry temperature in judge units (bradley_terry only; default 0.25)")
    p.add_argument("--samples-per-prompt", type=int, default=None,
                   help="K completions per preference prompt, best vs worst is the pair (default 4)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of every stage (seed_everything, PPO rollout_seed, preference sampling); "
                        "default: the configs' seeds. The evaluation keeps its own fixed seed")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the whole demo; returns the exit status (that of the first failing stage)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        run(args)
    except StageFailed as e:
        print(f"[demo] FAILED: {e}", file=sys.stderr, flush=True)
        return e.returncode or 1
    return 0


def train(args: argparse.Namespace, budget: Budget, paths: Paths, timings: dict[str, float]) -> dict:
    """Split, SFT, preferences, RM and the PPO run(s), each stage a subprocess; returns facts for the summary."""
    from rlhf_lit.demo.prompts import RANGES, write_splits

    configs = Path(args.config_dir)
    seed_args = [] if args.seed is None else ["--seed_everything", str(args.seed)]
    logger_root = ["--trainer.logger.init_args.save_dir", str(paths.root)]

    t0 = time.perf_counter()
    splits = write_splits(args.paragraphs, str(paths.dir("data")))
    timings["split"] = time.perf_counter() - t0
    ranges = ", ".join(f"{k} {RANGES[k][0]}-{sum(RANGES[k]) - 1}" for k in splits)
    _say(f"split: paragraphs {ranges} -> {paths.dir('data')}")

    run_stages({"sft": _fit(configs / "sft.yaml", [
        *logger_root, *seed_args, "--model.init_args.model", args.base_model,
        "--model.init_args.export_dir", str(paths.model("sft")),
        "--data.init_args.train_path", splits["sft"], *budget.sft,
    ])}, paths, timings)  # fmt: skip

    temperature, max_new_tokens = _ppo_sampling(configs / "ppo.yaml", budget)
    preferences = paths.dir("prefs") / "preferences.jsonl"
    pref_cmd = [
        sys.executable, "-m", "rlhf_lit.demo", "preferences", "--model", str(paths.model("sft")),
        "--out", str(preferences), "--paragraphs", args.paragraphs, "--judge", args.judge,
        "--samples-per-prompt", str(args.samples_per_prompt or budget.samples_per_prompt),
        "--labeler", args.labeler, "--temperature", str(temperature), "--max-new-tokens", str(max_new_tokens),
    ]  # fmt: skip
    if args.bt_temperature is not None:
        pref_cmd += ["--bt-temperature", str(args.bt_temperature)]
    if budget.pref_prompts is not None:
        pref_cmd += ["--count", str(budget.pref_prompts)]
    if args.seed is not None:
        pref_cmd += ["--seed", str(args.seed)]
    run_stages({"preferences": pref_cmd}, paths, timings)

    run_stages({"rm": _fit(configs / "rm.yaml", [
        *logger_root, *seed_args, "--model.init_args.model", str(paths.model("sft")),
        "--model.init_args.export_dir", str(paths.model("rm")),
        "--data.init_args.train_path", str(preferences), *budget.rm,
    ])}, paths, timings)  # fmt: skip
    rm_accuracy = _last_scalar(paths.run("rm"), "val/accuracy")
    with open(preferences, encoding="utf-8") as f:
        num_pairs = sum(1 for _ in f)
    _say(f"rm: {num_pairs} judge-labelled pairs, held-out pair accuracy {_fmt(rm_accuracy)}")

    ppo_args = [
        *logger_root, *seed_args, "--model.init_args.sft_model", str(paths.model("sft")),
        "--model.init_args.reward_model", str(paths.model("rm")), "--model.init_args.judge", args.judge,
        "--data.init_args.train_path", splits["ppo"], *budget.ppo,
        *([] if budget.max_new_tokens is None else ["--model.init_args.sampling.max_new_tokens", str(max_new_tokens)]),
        *([] if args.seed is None else ["--model.init_args.rollout_seed", str(args.seed)]),
    ]  # fmt: skip
    ppo_runs = {"ppo": _fit(configs / "ppo.yaml", [*ppo_args, "--model.init_args.export_dir", str(paths.model("ppo"))])}
    if not args.skip_kl0:
        # Same config, prompts and seeds; only the KL coefficient differs (and where the run goes).
        ppo_runs["ppo_kl0"] = _fit(configs / "ppo.yaml", [
            *ppo_args, "--model.init_args.kl.kind", "fixed", "--model.init_args.kl.init_coef", "0",
            "--trainer.logger.init_args.name", "ppo_kl0", "--model.init_args.export_dir", str(paths.model("ppo_kl0")),
        ])  # fmt: skip
    run_stages(ppo_runs, paths, timings)  # in parallel: one process and one core each
    return {"policies": list(ppo_runs), "rm_accuracy": rm_accuracy, "num_pairs": num_pairs,
            "temperature": temperature, "max_new_tokens": max_new_tokens}


def measure(
    args: argparse.Namespace, budget: Budget, paths: Paths, trained: dict, timings: dict[str, float]
) -> tuple[dict[str, dict], str]:
    """Evaluate SFT and the PPO policies on the held-out prompts and write the report; in this process."""
    import torch
    from transformers.utils import logging as hf_logging

    from rlhf_lit.demo.evaluate import evaluate
    from rlhf_lit.demo.prompts import RANGES
    from rlhf_lit.demo.report import write_report
    from rlhf_lit.models.generation import SamplingConfig

    torch.set_num_threads(1)
    hf_logging.disable_progress_bar()  # one "Loading weights" bar per model would bury the table
    t0 = time.perf_counter()
    # The temperature PPO sampled with, so the measured KL is the one its penalty controlled.
    sampling = SamplingConfig(temperature=trained["temperature"], max_new_tokens=trained["max_new_tokens"])
    start, count = RANGES["eval"]
    results = {}
    for name in ("sft", *trained["policies"]):
        results[name] = evaluate(
            str(paths.model(name)), str(paths.model("sft")), args.paragraphs, start=start,
            count=budget.eval_prompts or count, judge=args.judge, sampling=sampling,
            out=str(paths.dir("eval") / f"{name}.json"),
        )  # fmt: skip
    timings["evaluate"] = time.perf_counter() - t0
    _say(f"evaluate: done in {timings['evaluate']:.1f} s -> {paths.dir('eval')}")

    t0 = time.perf_counter()
    with_kl0 = "ppo_kl0" in trained["policies"]
    report = write_report(
        str(paths.run("ppo")), str(paths.dir("report")), label="PPO",
        compare=str(paths.run("ppo_kl0")) if with_kl0 else None, compare_label="PPO, KL coef 0",
        before=str(paths.dir("eval") / "sft.json"), after=str(paths.dir("eval") / "ppo.json"),
    )  # fmt: skip
    timings["report"] = time.perf_counter() - t0
    return results, report


def run(args: argparse.Namespace) -> dict:
    """The pipeline proper (see the module docstring); returns what it printed, as a dict."""
    t_start = time.perf_counter()
    budget = TINY if args.tiny else FULL
    paths = Paths(Path(args.out).absolute())
    for name in STAGE_DIRS:  # a rerun replaces the previous run, and TensorBoard runs stay version_0
        shutil.rmtree(paths.root / name, ignore_errors=True)
    paths.dir("logs").mkdir(parents=True)
    timings: dict[str, float] = {}

    trained = train(args, budget, paths, timings)
    results, report = measure(args, budget, paths, trained, timings)
    wall = time.perf_counter() - t_start
    timings["total"] = wall
    summary = write_summary(paths, results, trained["rm_accuracy"], trained["num_pairs"], report, timings)

    models = {name: str(paths.model(name)) for name in ("sft", "rm", *trained["policies"])}
    outcome = {
        "models": models, "preference_pairs": trained["num_pairs"], "rm_val_accuracy": trained["rm_accuracy"],
        "report": report, "summary": str(summary), "metrics": {n: r["metrics"] for n, r in results.items()},
        "timings_s": timings, "tiny": args.tiny,
    }  # fmt: skip
    with open(paths.root / "results.json", "w", encoding="utf-8") as f:
        json.dump(outcome, f, indent=1)
    print("", *_results_table(results), "", sep="\n")
    for name, path in models.items():
        print(f"[demo] {name} model: {path}")
    print(f"[demo] RM held-out pair accuracy: {_fmt(trained['rm_accuracy'])} (of {trained['num_pairs']} pairs)")
    print(f"[demo] report: {report} and {summary}")
    print(f"[demo] TensorBoard: tensorboard --logdir {paths.root}")
    print(f"[demo] wall time: {wall:.1f} s ({wall / 60:.1f} min)", flush=True)
    return outcome


if __name__ == "__main__":
    sys.exit(main())

"""Seeds of a finished demo: PPO variants, the DPO beta sweep, BoNBoN per N and best-of-N, on several seeds.

A learning claim is a measurement on held-out prompts over several seeds, never one run. This
reruns the demo's PPO (``configs/demo/ppo.yaml``, optionally with overrides: a "variant") and
DPO (``configs/demo/dpo.yaml``, one run per beta) from a finished ``make demo`` folder's SFT model,
reward model and data, once per seed, and measures every policy the way the demo does
(:func:`demo.held_out_eval.evaluate`):

    python -m demo seeds --demo logs/demo --out logs/seeds --seeds 0 1 2 \\
        --variant default --variant "before=--model.init_args.optimizer.lr 1e-4"

With ``--bonbon-n 4,8,16`` it also runs BoNBoN (``configs/demo/bonbon.yaml``) once per N and seed: the
pairs first, the best and the worst of N SFT samples per training prompt by the demo's reward model
(:mod:`demo.seeds_bonbon`), then the fit from the SFT model. ``--best-of-n`` draws the best-of-N sweep
on the held-out prompts once per seed (else the demo folder's own sweep, one seed, is the comparison).

What a seed varies: PPO's ``model.rollout_seed`` (sampling and minibatch shuffles) and
``data.seed`` (prompt order), which decide a PPO run, plus ``seed_everything``; DPO's
``data.seed`` (pair order and its held-out split) and ``seed_everything``; BoNBoN's the same and the
sampling seed of its pairs; the best-of-N sweep's its sampling seed. Seed 0 is the demo's own run (its
configs set both to 0).

Written under ``--out`` (a folder this command creates, marked by :data:`MARKER`; a finished run
is reused by a rerun, nothing is deleted):

- ``<variant>/seed_<s>/``: the PPO run's TensorBoard logs, export, checkpoint evaluations and
  ``result.json`` (the per-rollout curves of ``objective/rlhf_reward``, ``objective/scores`` and
  ``objective/kl``, and the held-out measurements at every checkpoint);
- ``dpo/beta_<b>/seed_<s>/``: the same for DPO (held-out measurements only);
- ``bonbon/n_<N>/seed_<s>/``: the same for BoNBoN, with its pairs (``pairs.jsonl``) and what drawing them
  cost (``compute`` in ``result.json``: samples drawn, reward-model passes, wall seconds);
- ``best_of_n/seed_<s>/``: the sweep (``best_of_n.json``) and its cost;
- ``study.json`` and ``study.md`` (:mod:`demo.seeds_report`): means and standard errors
  over seeds, the shaped objective's first and last rollouts per seed, and each PPO seed's judge
  score against DPO's at the same KL; ``curves.png`` and ``frontier.png``.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from demo.plan import ASSETS, ROOT, parse_betas
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
from demo.seeds_bonbon import pairs_command, parse_ns, parse_sources, sampling_compute, sweep_command, training_prompts
from demo.seeds_report import CURVE_TAGS, write_study
from rlhf_lit.artifacts import write_text_atomically
from rlhf_lit.integrity import check_json_file

MARKER = ".rlhf-lit-seeds.json"
"""Written into ``--out`` when this command creates it; a non-empty folder without it is refused."""
RUN_MARKER = ".rlhf-lit-seeds-run"
"""Written first into each run's folder: only a folder holding it is cleared to start an unfinished run again."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
CONFIG_DIR = ROOT / "configs" / "demo"
COMMAND = "python -m demo seeds"
Method = Literal["ppo", "dpo", "bonbon", "best_of_n"]
"""What a job runs: a PPO variant, a DPO beta, BoNBoN at one N (pairs, then the fit), or the best-of-N sweep."""


RESERVED = ("dpo", "bonbon", "best_of_n")
"""Folders under ``--out`` of the other methods: no PPO variant may take their names."""


@dataclass(frozen=True)
class Job:
    """One training run of the study and where it goes.

    Attributes:
        method: what it runs (:data:`Method`).
        name: the variant (PPO), ``beta_<b>`` (DPO), ``n_<N>`` (BoNBoN) or ``sweep`` (best-of-N).
        seed: the run's seed.
        overrides: command-line overrides after the config (a variant's, DPO's beta, BoNBoN's settings).
        dir: the run's folder.
        n: BoNBoN's N (the samples per training prompt its pairs are the best and the worst of); the
            sweep's largest N.
        sources: BoNBoN's training prompts, the demo's ranges (:data:`demo.seeds_bonbon.PROMPT_SOURCES`).
    """

    method: Method
    name: str
    seed: int
    overrides: tuple[str, ...]
    dir: Path
    n: int | None = None
    sources: tuple[str, ...] = ("ppo",)

    @property
    def result_path(self) -> Path:
        """``result.json``: written last, so a run that has one is finished."""
        return self.dir / "result.json"


def parse_variant(text: str) -> tuple[str, tuple[str, ...]]:
    """``NAME`` or ``NAME=OVERRIDES`` (shell-quoted ``rlhf-lit fit`` options) -> (name, overrides)."""
    name, _, overrides = text.partition("=")
    if not _NAME.fullmatch(name) or name in RESERVED:  # a folder name under --out: no '/', no '..'
        raise argparse.ArgumentTypeError(
            f"--variant {text!r}: NAME must be letters, digits, '_', '.' or '-' (not first), and not one of "
            f"{', '.join(RESERVED)}"
        )
    return name, tuple(shlex.split(overrides))


def fit_command(job: Job, demo: Path, checkpoint_every: int) -> list[str]:
    """``rlhf-lit fit`` of ``job`` on the demo folder's models and data (the seed's options: the module docstring)."""
    if job.method in ("dpo", "bonbon"):
        pairs = demo / "prefs" / "preferences.jsonl" if job.method == "dpo" else job.dir / "pairs.jsonl"
        inputs = ["--model.init_args.model", str(demo / "sft" / "model"), "--data.init_args.train_path", str(pairs)]
    else:
        inputs = [
            "--model.init_args.sft_model",
            str(demo / "sft" / "model"),
            "--model.init_args.reward_model",
            str(demo / "reward_model" / "model"),
            "--data.init_args.train_path",
            str(demo / "data" / "ppo.txt"),
            *rollout_checkpointing(checkpoint_every, job.dir / "checkpoints"),
        ]
    return rlhf_lit_fit(
        CONFIG_DIR / f"{job.method}.yaml",
        [
            *inputs,
            *tb_logger(job.dir),
            "--model.init_args.export_dir",
            str(job.dir / "model"),
            *seed_overrides(job.seed, rollouts=job.method == "ppo"),
            *job.overrides,
        ],
    )


@dataclass(frozen=True)
class Evaluation:
    """How every policy is measured: the demo's held-out prompts, sampled as PPO samples.

    Attributes:
        paragraphs: the stories file whose held-out range gives the prompts.
        count: prompts (the first of the held-out range).
        max_new_tokens: the most tokens per response (PPO's ``sampling.max_new_tokens``).
        bon_prompts: held-out prompts of the best-of-N sweep (the first of the range; the demo's 128: 64
            samples of each).
        judge: the sweep's judge (the evaluation's).
    """

    paragraphs: str
    count: int = 256
    max_new_tokens: int = 48
    bon_prompts: int = 128
    judge: str = "rlhf_lit.evaluation.judges:vader"


def _evaluate(policy: Path, demo: Path, out: Path, evaluation: Evaluation, log) -> dict:
    """The demo's held-out evaluation of ``policy`` (:func:`demo.runner.held_out_metrics`); its metrics."""
    return held_out_metrics(
        policy, demo / "sft" / "model", evaluation.paragraphs, evaluation.count, evaluation.max_new_tokens, out, log
    )


def run_job(job: Job, demo: Path, evaluation: Evaluation, checkpoint_every: int) -> dict:
    """Train ``job`` (unless finished), evaluate its checkpoints and export, write ``result.json``."""
    if job.result_path.exists():
        return check_json_file(job.result_path, want_object=False)
    from demo.frontier import export_checkpoint_policy
    from demo.report import read_scalars
    from rlhf_lit.models.checkpoint_policy import rollout_checkpoints

    what = f"{job.method} {job.name} seed {job.seed}"
    fresh_run(job.dir, RUN_MARKER, what, COMMAND)
    if job.method == "best_of_n":
        return _run_sweep(job, demo, evaluation, what)
    with open(job.dir / "log.txt", "w", encoding="utf-8") as log:
        compute = {}
        if job.method == "bonbon":
            prompts = training_prompts(demo, job.sources, job.dir)
            cmd = pairs_command(demo, prompts, job.n, job.seed, evaluation.max_new_tokens, job.dir)
            compute["sampling_s"] = run_logged(cmd, log, f"the pairs of {what}")
            compute.update(sampling_compute(job.dir / "pairs_best_of_n.json"))
        compute["train_s"] = run_logged(fit_command(job, demo, checkpoint_every), log, what)
        evaluations = {}
        if job.method == "ppo":
            scalars = read_scalars(str(job.dir / "tb" / "version_0"))
            curves = {tag: scalars[tag][1] for tag in CURVE_TAGS}
            final = len(curves["objective/kl"])
            for rollout, path in sorted(rollout_checkpoints(str(job.dir / "checkpoints")).items()):
                if rollout != final:  # the final checkpoint holds the export's weights
                    policy = Path(
                        export_checkpoint_policy(path, str(demo / "sft" / "model"), str(job.dir / f"rollout_{rollout}"))
                    )
                    evaluations[rollout] = _evaluate(
                        policy, demo, job.dir / f"eval_rollout_{rollout}.json", evaluation, log
                    )
            evaluations[final] = _evaluate(job.dir / "model", demo, job.dir / "eval.json", evaluation, log)
        else:
            curves = {}
            evaluations["final"] = _evaluate(job.dir / "model", demo, job.dir / "eval.json", evaluation, log)
    result = {
        "method": job.method,
        "name": job.name,
        "seed": job.seed,
        "overrides": list(job.overrides),
        "curves": curves,
        "evaluations": evaluations,
        "compute": compute,
    }
    write_text_atomically(job.result_path, json.dumps(result, indent=1))  # a killed run leaves no half-written result
    return result


def _run_sweep(job: Job, demo: Path, evaluation: Evaluation, what: str) -> dict:
    """The best-of-N sweep of ``job`` on the held-out prompts (:func:`demo.seeds_bonbon.sweep_command`);
    ``result.json`` holds its rows and what it drew."""
    with open(job.dir / "log.txt", "w", encoding="utf-8") as log:
        cmd = sweep_command(
            demo,
            evaluation.paragraphs,
            evaluation.bon_prompts,
            job.n,
            job.seed,
            evaluation.max_new_tokens,
            job.dir,
            evaluation.judge,
        )
        seconds = run_logged(cmd, log, what)
    sweep = check_json_file(job.dir / "best_of_n.json", want_object=False)
    result = {
        "method": job.method,
        "name": job.name,
        "seed": job.seed,
        "overrides": [],
        "rows": sweep["rows"],
        "compute": {**sampling_compute(job.dir / "best_of_n.json"), "sampling_s": seconds},
    }
    write_text_atomically(job.result_path, json.dumps(result, indent=1))
    return result


def claim(out: Path) -> None:
    """Create ``out`` with :data:`MARKER`, or accept it when it has the marker; refuse any other non-empty folder."""
    claim_study(out, MARKER, COMMAND)


def plan(
    out: Path,
    seeds: Sequence[int],
    variants: Sequence[tuple[str, tuple[str, ...]]],
    betas: Sequence[float],
    bonbon_ns: Sequence[int] = (),
    bonbon_args: Sequence[str] = (),
    bonbon_sources: tuple[str, ...] = ("ppo",),
    bon_n_max: int | None = None,
) -> list[Job]:
    """Every run of the study: each variant, each DPO beta, each BoNBoN N (with ``bonbon_args``, its prompts
    from ``bonbon_sources``) and, with ``bon_n_max``, the best-of-N sweep up to it, once per seed."""
    jobs = [Job("ppo", name, s, overrides, out / name / f"seed_{s}") for name, overrides in variants for s in seeds]
    for beta in betas:
        name = f"beta_{beta:g}"
        jobs += [
            Job("dpo", name, s, ("--model.init_args.beta", f"{beta:g}"), out / "dpo" / name / f"seed_{s}")
            for s in seeds
        ]
    for n in bonbon_ns:
        folder = out / "bonbon" / f"n_{n}"
        jobs += [Job("bonbon", f"n_{n}", s, tuple(bonbon_args), folder / f"seed_{s}", n, bonbon_sources) for s in seeds]
    if bon_n_max is not None:
        jobs += [Job("best_of_n", "sweep", s, (), out / "best_of_n" / f"seed_{s}", bon_n_max) for s in seeds]
    return jobs


def build_parser() -> argparse.ArgumentParser:
    """Options of ``python -m demo seeds``."""
    p = argparse.ArgumentParser(
        prog="python -m demo seeds",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--demo", required=True, help="a finished `make demo` folder (its sft, reward_model, data and prefs)"
    )
    p.add_argument("--out", required=True, help="folder for the runs and the report")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of every run")
    p.add_argument(
        "--variant",
        type=parse_variant,
        action="append",
        default=None,
        help="NAME or NAME=OVERRIDES: the demo PPO config with these rlhf-lit fit options (repeatable; "
        "default: one variant 'default' without overrides)",
    )
    p.add_argument("--dpo-betas", type=parse_betas, default=(0.05, 0.1, 0.3), help="DPO betas of the sweep")
    p.add_argument("--skip-dpo", action="store_true", help="no DPO runs (and no comparison with DPO)")
    p.add_argument("--skip-ppo", action="store_true", help="no PPO runs (the other methods only)")
    p.add_argument(
        "--bonbon-n",
        type=parse_ns,
        default=(),
        metavar="N,N,...",
        help="BoNBoN runs, one per N (configs/demo/bonbon.yaml on the best and the worst of N SFT samples per "
        "training prompt); () runs none",
    )
    p.add_argument(
        "--bonbon-args",
        type=shlex.split,
        default=[],
        help="rlhf-lit fit options of every BoNBoN run (shell-quoted), e.g. '--model.init_args.alpha 0.05'",
    )
    p.add_argument(
        "--bonbon-prompts",
        type=parse_sources,
        default=("ppo",),
        metavar="RANGE,...",
        help="the demo's training ranges BoNBoN's pairs are drawn on: ppo (PPO's prompts), reward_model "
        "(the RM's and DPO's), or both",
    )
    p.add_argument(
        "--best-of-n",
        type=int,
        default=None,
        metavar="N_MAX",
        help="draw the best-of-N sweep N = 1, 2, 4, ... N_MAX on the held-out prompts once per seed; None: "
        "the demo folder's own sweep (one seed) is the comparison",
    )
    p.add_argument("--bon-prompts", type=int, default=128, help="held-out prompts of --best-of-n's sweep")
    p.add_argument("--checkpoint-every", type=int, default=10, help="PPO rollouts between evaluated checkpoints")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (one thread each)")
    p.add_argument("--paragraphs", default=None, help="the held-out stories (default: the demo's TinyStories val.txt)")
    p.add_argument("--eval-count", type=int, default=256, help="held-out prompts each policy is measured on")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=48,
        help="most tokens per evaluated response: keep it PPO's sampling.max_new_tokens",
    )
    p.add_argument("--baseline", default=None, help="variant that curves.png draws first (default: the first)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the study; exit status 2 on a refused ``--out`` or a demo folder without its models."""
    from transformers.utils import logging as hf_logging

    args = build_parser().parse_args(argv)
    hf_logging.disable_progress_bar()  # a bar per exported checkpoint would bury the progress lines
    demo, out = Path(args.demo), Path(args.out)
    for need in ("sft/model", "reward_model/model", "data/ppo.txt", "prefs/preferences.jsonl"):
        if not (demo / need).exists():
            print(
                f"error: --demo {demo} has no {need}: run `make demo` (or the pipeline with --out {demo}) first",
                file=sys.stderr,
            )
            return 2
    try:
        claim(out)
    except FileExistsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    variants = [] if args.skip_ppo else args.variant or [("default", ())]
    evaluation = Evaluation(
        args.paragraphs or str(ASSETS / "data" / "tinystories" / "val.txt"),
        args.eval_count,
        args.max_new_tokens,
        args.bon_prompts,
    )
    jobs = plan(
        out,
        args.seeds,
        variants,
        () if args.skip_dpo else args.dpo_betas,
        args.bonbon_n,
        args.bonbon_args,
        args.bonbon_prompts,
        args.best_of_n,
    )
    print(f"[seeds] {len(jobs)} runs, {args.jobs} at a time -> {out}", flush=True)

    def one(job: Job) -> dict:
        result = run_job(job, demo, evaluation, args.checkpoint_every)
        print(f"[seeds] {job.method} {job.name} seed {job.seed}: done", flush=True)
        return result

    results = run_pool(one, jobs, args.jobs)
    sft = _evaluate(demo / "sft" / "model", demo, out / "eval_sft.json", evaluation, out / "eval_sft.log")
    best_of_n = demo / "best_of_n" / "best_of_n.json"
    report = write_study(
        [r for r in results if r["method"] != "best_of_n"],
        sft,
        str(out),
        best_of_n=str(best_of_n) if best_of_n.exists() else None,
        baseline=args.baseline,
        sweeps=[r for r in results if r["method"] == "best_of_n"],
    )
    print(f"[seeds] report: {report}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

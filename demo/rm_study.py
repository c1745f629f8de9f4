"""Rankings against pairs: how the demo's K judged samples per prompt are best turned into RM data.

InstructGPT trained its reward model on K-way rankings, all C(K, 2) comparisons of a prompt in
one batch element, and warned that the same comparisons as separate pairs overfit (Ouyang et al.
2022, section 3.5). This study measures it on the demo task, at equal labelling cost:

    python -m demo rm-study --sft logs/demo/sft/model --out logs/rm_study --seeds 0 1 2

Per seed ``s``, the SFT model samples K completions for every prompt of the RM paragraph range
(sampling seed ``s``) and the judge scores each sample ONCE. From those same samples and scores,
each variant (a :data:`~demo.labeling.Pairing`) writes its training records:
``best_worst`` (one pair per prompt, the demo's old default), ``ranking`` (one record of all K,
``format: rankings``) and ``all_pairs`` (the C(K, 2) pairs as separate pair records). An RM is
trained on each with ``configs/demo/reward_model.yaml`` (``seed_everything`` and ``data.seed``
set to ``s``, no validation split: every prompt trains) and measured on ONE fixed held-out pair
set, the same for every variant and seed: K samples of each held-out prompt (sampling seed
:data:`HELDOUT_SEED`), all their untied pairs labelled by the judge, from paragraphs that no demo
stage uses (:data:`HELDOUT_RANGE`). The held-out set is the RM run's validation set, so its
``val/accuracy`` is the measurement; ranking runs read it as K = 2 rankings (the same pairs).

Written under ``--out`` (a folder this command creates, marked by :data:`MARKER`; a rerun reuses
what is finished and deletes nothing it did not write): ``heldout/`` (samples and the pair set in
both formats), ``seed_<s>/samples.json``, ``seed_<s>/<variant>/`` (training records, the run's
TensorBoard logs and export, ``log.txt``, ``result.json``), then ``study.json`` and ``study.md``
(:mod:`demo.rm_study_report`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from demo.labeling import Pairing
from demo.plan import ASSETS, FULL, ROOT, ppo_sampling
from demo.runner import claim_study, fresh_run, run_logged, run_pool, seed_overrides, tb_logger
from demo.runner import fit_command as rlhf_lit_fit
from demo.story_prompts import RANGES
from rlhf_lit.artifacts import write_text_atomically
from rlhf_lit.integrity import check_json_file

MARKER = ".rlhf-lit-rm-study.json"
"""Written into ``--out`` when this command creates it; a non-empty folder without it is refused."""
RUN_MARKER = ".rlhf-lit-rm-study-run"
"""Written first into each run's folder: only a folder holding it is cleared to start an unfinished run again."""
HELDOUT_RANGE = (3256, 500)
"""``(start, count)`` of the held-out paragraphs: after the demo's eval range (3000-3255), used by no demo stage."""
HELDOUT_SEED = 12345
"""Sampling seed of the held-out set (fixed: the same pairs for every variant and seed)."""
VARIANTS: tuple[Pairing, ...] = ("best_worst", "ranking", "all_pairs")
CONFIG = ROOT / "configs" / "demo" / "reward_model.yaml"
COMMAND = "python -m demo rm-study"


@dataclass(frozen=True)
class Sampling:
    """How samples are drawn and judged: the demo's preference settings.

    Attributes:
        sft: the SFT model sampled from.
        paragraphs: the TinyStories file.
        samples_per_prompt: K.
        count: training prompts (the first of the RM range).
        temperature, max_new_tokens: sampling settings (PPO's, as the demo's preferences use).
    """

    sft: str
    paragraphs: str
    samples_per_prompt: int = 4
    count: int = RANGES["reward_model"][1]
    temperature: float = 1.0
    max_new_tokens: int = 48


def samples(sampling: Sampling, path: Path, start: int, count: int, seed: int) -> dict:
    """The judged samples of ``count`` prompts from paragraph ``start`` (seed ``seed``), cached in ``path``."""
    if path.exists():
        return check_json_file(path, want_object=False)
    import torch

    from demo.preferences import sample_and_judge
    from demo.story_prompts import load_prompts
    from rlhf_lit.evaluation.judges import DEFAULT_JUDGE
    from rlhf_lit.models.generation import SamplingConfig

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    judged = sample_and_judge(
        sampling.sft,
        *load_prompts(sampling.paragraphs, start, count, 8),
        samples_per_prompt=sampling.samples_per_prompt,
        judge=DEFAULT_JUDGE,
        sampling=SamplingConfig(temperature=sampling.temperature, max_new_tokens=sampling.max_new_tokens),
        batch_size=64,
        seed=seed,
        tokenizer=None,
        device="cpu",
    )
    judged["seconds"] = time.perf_counter() - t0
    judged["judge_calls"] = len(judged["responses"])
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, json.dumps(judged))
    return judged


def heldout_sets(judged: dict, k: int, folder: Path) -> dict[str, Path]:
    """The held-out pair set as ``pairs.jsonl`` (format fields) and ``rankings.jsonl`` (K = 2 rankings).

    Every untied pair of every held-out prompt's K samples, the higher judge score chosen (pairs
    with an empty response dropped, as in training data).
    """
    from demo.preferences import label_pairs
    from rlhf_lit.artifacts import write_jsonl_atomically

    pairs, _, _ = label_pairs(
        judged["paragraphs"],
        judged["prompts"],
        judged["responses"],
        judged["scores"],
        k,
        "argmax",
        "all_pairs",
        1.0,
        random.Random(0),
    )
    rankings = [
        {
            "prompt": p["prompt"],
            "responses": [p["chosen"], p["rejected"]],
            "ranks": [0, 1],
            "scores": [p["chosen_score"], p["rejected_score"]],
            "paragraph": p["paragraph"],
        }
        for p in pairs
    ]
    out = {"fields": folder / "pairs.jsonl", "rankings": folder / "rankings.jsonl"}
    write_jsonl_atomically(str(out["fields"]), pairs)
    write_jsonl_atomically(str(out["rankings"]), rankings)
    return out


@dataclass(frozen=True)
class Run:
    """One RM training of the study: a variant on one seed's samples.

    Attributes:
        variant: what the samples become (:data:`VARIANTS`).
        seed: the seed of the samples and of the training.
        dir: the run's folder.
    """

    variant: Pairing
    seed: int
    dir: Path

    @property
    def format(self) -> str:
        """The data module's format of the run's records."""
        return "rankings" if self.variant == "ranking" else "fields"


def fit_command(run: Run, sft: str, train: Path, heldout: dict[str, Path], overrides: Sequence[str]) -> list[str]:
    """``rlhf-lit fit`` of the demo RM config on ``train``, validated on the held-out set."""
    # Set either way: the config may read rankings (and ties) by default.
    ranks = ["--data.init_args.fields.ranks", "ranks" if run.format == "rankings" else "null"]
    return rlhf_lit_fit(
        CONFIG,
        [
            "--model.init_args.model",
            sft,
            "--model.init_args.export_dir",
            str(run.dir / "model"),
            "--data.init_args.train_path",
            str(train),
            "--data.init_args.val_path",
            str(heldout[run.format]),
            "--data.init_args.val_fraction",
            "0",
            "--data.init_args.format",
            run.format,
            *ranks,
            *seed_overrides(run.seed, rollouts=False),
            *tb_logger(run.dir),
            *overrides,
        ],
    )


def train_records(judged: dict, run: Run, k: int) -> tuple[list[dict], dict]:
    """The run's training records (argmax labels of the seed's samples) and their counts."""
    from demo.preferences import count_pairs, label

    records, ties, empty = label(judged, k, "argmax", run.variant, 1.0, random.Random(run.seed))
    sequences = sum(len(r["responses"]) if "responses" in r else 2 for r in records)
    return records, {
        "records": len(records),
        "comparisons": sum(count_pairs(r) for r in records),
        "sequences": sequences,
        "ties": ties,
        "empty": empty,
    }


def run_one(run: Run, judged: dict, k: int, sft: str, heldout: dict[str, Path], overrides: Sequence[str]) -> dict:
    """Write the records, train the RM (unless finished), read its held-out metrics, write ``result.json``."""
    result_path = run.dir / "result.json"
    if result_path.exists():
        return check_json_file(result_path, want_object=False)
    from demo.report import read_scalars
    from rlhf_lit.artifacts import write_jsonl_atomically

    fresh_run(run.dir, RUN_MARKER, f"{run.variant} seed {run.seed}", COMMAND)  # begun and not finished: anew
    records, counts = train_records(judged, run, k)
    train = run.dir / "train.jsonl"
    write_jsonl_atomically(str(train), records)
    seconds = run_logged(
        fit_command(run, sft, train, heldout, overrides), run.dir / "log.txt", f"{run.variant} seed {run.seed}"
    )
    scalars = read_scalars(str(run.dir / "tb" / "version_0"))
    val = {tag: values for tag, (_, values) in scalars.items() if tag.startswith("val/")}
    result = {
        "variant": run.variant,
        "seed": run.seed,
        "counts": counts,
        "fit_seconds": seconds,
        "val": val,
        "overrides": list(overrides),
    }
    write_text_atomically(result_path, json.dumps(result, indent=1))  # last: a run with it is finished
    return result


def claim(out: Path) -> None:
    """Create ``out`` with :data:`MARKER`, or accept it when it has the marker; refuse any other non-empty folder."""
    claim_study(out, MARKER, COMMAND)


def machine() -> str:
    """The machine in words: CPU, cores, Python and torch versions."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores visible, one thread per process; "
        f"Python {platform.python_version()}, torch {torch.__version__}"
    )


def build_parser() -> argparse.ArgumentParser:
    """Options of ``python -m demo rm-study``."""
    p = argparse.ArgumentParser(
        prog="python -m demo rm-study",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--sft", required=True, help="the demo SFT model directory (read only)")
    p.add_argument("--out", required=True, help="folder for the samples, runs and the report")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of the samples and the RM runs")
    p.add_argument(
        "--variants",
        nargs="+",
        choices=get_args(Pairing),
        default=list(VARIANTS),
        help="what the K samples of a prompt become",
    )
    p.add_argument("--samples-per-prompt", type=int, default=4, help="K completions per prompt")
    p.add_argument(
        "--count",
        type=int,
        default=RANGES["reward_model"][1],
        help="training prompts (the first of the RM paragraph range)",
    )
    p.add_argument(
        "--heldout-count",
        type=int,
        default=HELDOUT_RANGE[1],
        help=f"held-out prompts, from paragraph {HELDOUT_RANGE[0]}",
    )
    p.add_argument(
        "--paragraphs", default=str(ASSETS / "data" / "tinystories" / "val.txt"), help="TinyStories paragraphs"
    )
    p.add_argument("--max-new-tokens", type=int, default=None, help="most tokens per sample (default: PPO's)")
    p.add_argument("--jobs", type=int, default=2, help="RM trainings at a time (one thread each)")
    p.add_argument(
        "--report-only",
        action="store_true",
        help="train and sample nothing: write the report of the runs already finished",
    )
    p.add_argument(
        "--rm-overrides",
        type=shlex.split,
        default=[],
        help="extra rlhf-lit fit options of every RM run, shell-quoted (e.g. '--trainer.max_epochs 1')",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the study; exit status 2 on a refused ``--out`` or a missing SFT model."""
    from transformers.utils import logging as hf_logging

    from demo.rm_study_report import write_study

    args = build_parser().parse_args(argv)
    hf_logging.disable_progress_bar()
    out = Path(args.out)
    if not (Path(args.sft) / "config.json").exists():
        print(f"error: --sft {args.sft} is no model directory (no config.json): run `make demo` first", file=sys.stderr)
        return 2
    try:
        claim(out)
    except FileExistsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    temperature, max_new_tokens = ppo_sampling(ROOT / "configs" / "demo" / "ppo.yaml", FULL)
    sampling = Sampling(
        args.sft,
        args.paragraphs,
        args.samples_per_prompt,
        args.count,
        temperature,
        args.max_new_tokens or max_new_tokens,
    )
    k = sampling.samples_per_prompt
    if args.report_only and not (out / "heldout" / "samples.json").exists():
        print(f"error: --report-only: --out {out} holds no held-out samples yet", file=sys.stderr)
        return 2
    held = samples(sampling, out / "heldout" / "samples.json", HELDOUT_RANGE[0], args.heldout_count, HELDOUT_SEED)
    heldout = heldout_sets(held, k, out / "heldout")
    seeds = [s for s in args.seeds if not args.report_only or (out / f"seed_{s}" / "samples.json").exists()]
    judged = {
        s: samples(sampling, out / f"seed_{s}" / "samples.json", RANGES["reward_model"][0], sampling.count, s)
        for s in seeds
    }
    print(f"[rm-study] samples ready ({time.perf_counter() - t0:.0f} s)", flush=True)
    runs = [Run(v, s, out / f"seed_{s}" / v) for s in seeds for v in args.variants]
    if args.report_only:  # what is not finished is left out of the report, and said
        for run in runs:
            if not (run.dir / "result.json").exists():
                print(f"[rm-study] {run.variant} seed {run.seed}: not finished, left out", flush=True)
        runs = [run for run in runs if (run.dir / "result.json").exists()]
        if not runs:
            print(f"error: no finished run under --out {out}", file=sys.stderr)
            return 2

    def one(run: Run) -> dict:
        result = run_one(run, judged[run.seed], k, args.sft, heldout, args.rm_overrides)
        print(f"[rm-study] {run.variant} seed {run.seed}: {result['fit_seconds']:.0f} s", flush=True)
        return result

    results = run_pool(one, runs, args.jobs)
    with open(heldout["fields"], encoding="utf-8") as f:
        heldout_pairs = sum(1 for _ in f)
    setup = {
        "command": "python -m demo rm-study " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "machine": machine(),
        "samples_per_prompt": k,
        "train_prompts": sampling.count,
        "train_paragraphs": [RANGES["reward_model"][0], RANGES["reward_model"][0] + sampling.count],
        "heldout_paragraphs": [HELDOUT_RANGE[0], HELDOUT_RANGE[0] + args.heldout_count],
        "heldout_seed": HELDOUT_SEED,
        "heldout_pairs": heldout_pairs,
        "judge_calls_per_seed": judged[seeds[0]]["judge_calls"],
        "sampling_seconds": {str(s): judged[s]["seconds"] for s in seeds},
        "heldout_sampling_seconds": held["seconds"],
        "wall_seconds": time.perf_counter() - t0,
    }
    report = write_study(results, setup, str(out))
    print(f"[rm-study] report: {report}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

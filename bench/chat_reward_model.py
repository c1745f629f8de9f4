"""The chat demo's reward model on the judge's labels: held-out pair accuracy of training recipes (what a
speed lever costs in accuracy, and which recipe clears the demo's 0.70 floor).

    OMP_NUM_THREADS=2 .venv/bin/python bench/chat_reward_model.py --label-prompts 700 --val-prompts 100 \\
        --variant "shipped=" --variant "lr3e-4=--model.init_args.optimizer.lr 3e-4"

1. **requests**: the chat demo's labelling requests (:mod:`demo.chat_prompts`: its seeded split, never
   the 128 held-out evaluation requests), the first ``--label-prompts`` to train on and the next
   ``--val-prompts`` held out;
2. **labels**: ``--samples-per-prompt`` replies of the instruction model to each, at the demo's sampling
   settings, ranked by the judge (``python -m demo preferences``, as ``make demo-chat`` labels), or
   ``--labels-from`` an earlier run's folder (its labels copied, so that recipes compare on one set);
3. **variants**: one ``rlhf-lit fit --config configs/demo_chat/reward_model.yaml`` per ``--variant
   NAME=OPTIONS`` (extra fit options; empty: the shipped recipe), validated on the held-out rankings.

Each variant's export then scores every held-out reply (:class:`rlhf_lit.evaluation.reward_judge.
RewardModelScorer`, as a judge reads it); the accuracy is the share of the held-out rankings' untied
pairs it orders as the judge did, with a standard error over requests (the pairs of one request share
replies, so they are not independent: the standard error of the mean of the per-request accuracies). The fit's own ``val/accuracy`` is printed beside it as a cross-check.
Writes ``bench/results/chat-reward-model-<UTC date>[-N].json`` (a new name, never over an earlier run).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import subprocess
import sys
import time
from pathlib import Path

from results_file import write_result

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the demo's package, beside rlhf_lit in a clone


def parse_variant(text: str) -> tuple[str, list[str]]:
    """``NAME=OPTIONS`` as ``(name, options split as a shell would)``."""
    name, sep, options = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--variant {text!r}: expected NAME=OPTIONS (OPTIONS may be empty)")
    return name, shlex.split(options)


def write_requests(out: Path, n_label: int, n_val: int) -> tuple[Path, Path]:
    """The training and held-out requests as prompt files (one-turn conversations, as the demo writes them)."""
    from demo.chat_plan import HH_FILE
    from demo.chat_prompts import conversation, first_human_turns, split_prompts

    label = split_prompts(first_human_turns(HH_FILE), {"eval": 128, "label": n_label + n_val, "ppo": 0})["label"]
    paths = (out / "data" / "train.jsonl", out / "data" / "val.jsonl")
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    for path, requests in zip(paths, (label[:n_label], label[n_label:])):
        path.write_text("".join(json.dumps({"prompt": conversation(r)}) + "\n" for r in requests), encoding="utf-8")
    return paths


def label(model: str, prompts: Path, rankings: Path, k: int, seed: int, precision: str) -> None:
    """``python -m demo preferences`` at the chat demo's sampling settings (sampled at ``precision``); the
    rankings to ``rankings``."""
    from demo.chat_plan import CHAT_FULL, sampling_options

    cmd = [sys.executable, "-m", "demo", "preferences", "--model", model, "--prompts", str(prompts)]
    cmd += ["--out", str(rankings.with_suffix(".pairs.jsonl")), "--rankings-out", str(rankings)]
    cmd += ["--samples-per-prompt", str(k), *sampling_options(CHAT_FULL)]
    cmd += ["--seed", str(seed), "--precision", precision]
    subprocess.run(cmd, cwd=ROOT, check=True)


def reused_labels(source: Path, out: Path) -> tuple[Path, Path, dict]:
    """An earlier run's training and held-out rankings (``source/data``), copied into ``out/data`` so this
    run's folder holds what it fitted on: ``(train, val, what the JSON says of the labels)``."""
    out_data = out / "data"
    out_data.mkdir(parents=True, exist_ok=True)
    copies = []
    for part in ("train", "val"):
        origin = source / "data" / f"{part}.rankings.jsonl"
        if not origin.is_file():
            raise SystemExit(f"--labels-from {source}: no {origin.relative_to(source)} (not a folder this bench wrote)")
        copy = out_data / origin.name
        copy.write_bytes(origin.read_bytes())
        copies.append(copy)
    counts = [sum(1 for line in c.read_text(encoding="utf-8").splitlines() if line.strip()) for c in copies]
    return copies[0], copies[1], {"labels_from": str(source), "label_prompts": counts[0], "val_prompts": counts[1]}


def scored_rankings(export: Path, rankings: Path) -> list[tuple[dict, list[float]]]:
    """Each held-out ranking record of ``rankings`` with ``export``'s scores of its replies."""
    from rlhf_lit.evaluation.reward_judge import RewardModelScorer

    records = [json.loads(line) for line in rankings.read_text(encoding="utf-8").split("\n") if line.strip()]
    scorer = RewardModelScorer(str(export))
    return [(record, scorer([record["prompt"]] * len(record["responses"]), record["responses"])) for record in records]


def judged_pairs(record: dict) -> list[tuple[int, int]]:
    """The untied pairs ``(better, worse)`` of a ranking record (its ``ranks``: lower is better, equal a tie)."""
    ranks = record["ranks"]
    return [(a, b) for a in range(len(ranks)) for b in range(len(ranks)) if ranks[a] < ranks[b]]


def held_out_accuracy(scored: list[tuple[dict, list[float]]]) -> tuple[float, float, int]:
    """``(accuracy, standard error over requests, untied pairs)`` of the scores on the rankings."""
    per_request = []  # (right, pairs) of each request
    for record, scores in scored:
        pairs = judged_pairs(record)
        if pairs:
            per_request.append((sum(scores[a] > scores[b] for a, b in pairs), len(pairs)))
    right, total = sum(r for r, _ in per_request), sum(n for _, n in per_request)
    accuracy = right / total
    shares = [r / n for r, n in per_request]
    mean = sum(shares) / len(shares)
    se = math.sqrt(sum((s - mean) ** 2 for s in shares) / (len(shares) - 1) / len(shares))
    return accuracy, se, total


MARGIN_EDGES = (0.1, 0.3, 0.6)
"""The judge-margin buckets of :func:`accuracy_by_margin`: below 0.1, 0.1 to 0.3, 0.3 to 0.6, 0.6 and over."""


def accuracy_by_margin(scored: list[tuple[dict, list[float]]]) -> dict[str, dict[str, float]]:
    """Pair accuracy by the judge's margin between the two replies (the records' ``scores``), where the
    reward model's errors sit: ``{bucket: {"pairs": n, "accuracy": a}}``, buckets by :data:`MARGIN_EDGES`."""
    names = [f"<{MARGIN_EDGES[0]}"] + [f"{lo}-{hi}" for lo, hi in zip(MARGIN_EDGES, MARGIN_EDGES[1:])]
    names.append(f">={MARGIN_EDGES[-1]}")
    counts = {name: [0, 0] for name in names}  # right, pairs
    for record, scores in scored:
        judge = record["scores"]
        for a, b in judged_pairs(record):
            bucket = names[sum(judge[a] - judge[b] >= edge for edge in MARGIN_EDGES)]
            counts[bucket][0] += scores[a] > scores[b]
            counts[bucket][1] += 1
    return {name: {"pairs": n, "accuracy": right / n if n else float("nan")} for name, (right, n) in counts.items()}


def fit(model: str, name: str, options: list[str], out: Path, train: Path, val: Path) -> tuple[Path, float, float]:
    """One reward-model fit of a variant; ``(export, fit seconds, its logged val/accuracy)``."""
    from demo.summary import last_scalar

    run = out / "runs" / name
    cmd = [sys.executable, "-m", "rlhf_lit.cli", "fit", "--config", str(ROOT / "configs/demo_chat/reward_model.yaml")]
    cmd += ["--model.init_args.model", model, "--trainer.logger.init_args.save_dir", str(run)]
    cmd += ["--model.init_args.export_dir", str(run / "model"), "--data.init_args.train_path", str(train)]
    cmd += ["--data.init_args.val_path", str(val), "--data.init_args.val_fraction", "0", *options]
    print("$", shlex.join(cmd), flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True)
    seconds = time.perf_counter() - t0
    logs = next(p.parent for p in run.rglob("events.out.tfevents.*"))
    return run / "model", seconds, last_scalar(logs, "val/accuracy")


def main(argv: list[str] | None = None) -> int:
    """Label once, fit every variant, score the held-out replies, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="SmolLM2-135M-Instruct folder (default: make smollm2's cache)")
    p.add_argument("--out", default="runs/chat_rm", help="where the labels and fits go (a new folder)")
    p.add_argument("--label-prompts", type=int, default=700)
    p.add_argument("--val-prompts", type=int, default=100)
    p.add_argument("--samples-per-prompt", type=int, default=4)
    p.add_argument("--seed", type=int, default=0, help="the labels' sampling seed")
    p.add_argument(
        "--label-precision", default="32-true", choices=("32-true", "bf16-mixed"), help="the labels' sampling"
    )
    p.add_argument(
        "--labels-from",
        default=None,
        help="an earlier run's --out folder: fit on its labels (data/) instead of sampling new ones",
    )
    p.add_argument("--variant", type=parse_variant, action="append", required=True, metavar="NAME=OPTIONS")
    args = p.parse_args(argv)
    from demo.chat_plan import fetched_model

    model = args.model or fetched_model()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=False)  # a new folder: never over an earlier run's
    t0 = time.perf_counter()
    if args.labels_from:
        train, val, labels = reused_labels(Path(args.labels_from), out)
    else:
        requests = write_requests(out, args.label_prompts, args.val_prompts)
        train, val = (out / "data" / f"{part}.rankings.jsonl" for part in ("train", "val"))
        for prompts, rankings in zip(requests, (train, val)):
            label(model, prompts, rankings, args.samples_per_prompt, args.seed, args.label_precision)
        labels = {"label_prompts": args.label_prompts, "val_prompts": args.val_prompts}
        labels |= {"samples_per_prompt": args.samples_per_prompt, "label_precision": args.label_precision}
    label_seconds = time.perf_counter() - t0
    results = {}
    for name, options in args.variant:
        export, seconds, logged = fit(model, name, options, out, train, val)
        scored = scored_rankings(export, val)
        accuracy, se, pairs = held_out_accuracy(scored)
        by_margin = accuracy_by_margin(scored)
        results[name] = {
            "options": options,
            "accuracy": accuracy,
            "se": se,
            "pairs": pairs,
            "by_judge_margin": by_margin,
        }
        results[name] |= {"logged_val_accuracy": logged, "fit_seconds": seconds}
        print(f"{name}: held-out pair accuracy {accuracy:.3f} +- {se:.3f} ({pairs} pairs); fit {seconds:.0f} s")
        print(
            "  by the judge's margin: "
            + ", ".join(f"{k} {v['accuracy']:.2f} ({v['pairs']})" for k, v in by_margin.items())
        )
    write_result("chat-reward-model", {**labels, "label_seconds": label_seconds, "variants": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())

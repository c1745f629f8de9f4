#!/usr/bin/env python
"""The table of bench/odin_demo_study.sh: plain against length-debiased (ODIN) reward models in the
demo's setting, mean +- standard error over seeds.

    python bench/odin_demo_summary.py --work /tmp/odin_demo [--json out.json]

Per variant: the reward models' last validation accuracy and ``val/length_correlation`` (Pearson's
correlation of the exported score with response tokens over the held-out ranked responses, logged
by the reward-model stage); PPO's per-rollout response length, judge (VADER) and RM score, first
rollout and mean of the last 5; and the held-out evaluation of each PPO export (``python -m demo
evaluate``: 256 prompts, judge, KL to SFT, length, distinct-2) beside the SFT model's.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
from statistics import mean, stdev

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def scalars(log_dir: str) -> dict[str, list[float]]:
    """Every scalar tag of the newest events file under ``log_dir``, values in step order."""
    files = sorted(
        glob.glob(os.path.join(log_dir, "**", "events.out.tfevents.*"), recursive=True), key=os.path.getmtime
    )
    if not files:
        return {}
    events = EventAccumulator(files[-1], size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def mean_se(values: list[float]) -> str:
    """``mean +- standard error`` (n seeds), or the single value."""
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{mean(values):.3f} ± {stdev(values) / math.sqrt(len(values)):.3f}"


def main() -> None:
    """Print the markdown table (and write the per-seed numbers as JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows: dict[str, dict[str, list[float]]] = {}
    for variant in ("plain", "odin"):
        row: dict[str, list[float]] = {}
        for rm_dir in sorted(
            d for d in glob.glob(os.path.join(args.work, "logs", f"rm_{variant}_s*")) if os.path.isdir(d)
        ):
            seed = rm_dir.rsplit("_s", 1)[1]
            rm = scalars(rm_dir)
            ppo = scalars(os.path.join(args.work, "logs", f"ppo_{variant}_s{seed}"))
            evaluation = os.path.join(args.work, "eval", f"ppo_{variant}_s{seed}.json")
            metrics = json.load(open(evaluation))["metrics"] if os.path.exists(evaluation) else {}
            found = {
                "rm_val_accuracy": (rm.get("val/accuracy") or [None])[-1],
                "rm_val_length_correlation": (rm.get("val/length_correlation") or [None])[-1],
                "ppo_length_first": (ppo.get("response/length") or [None])[0],
                "ppo_length_last5": mean(ppo["response/length"][-5:]) if ppo.get("response/length") else None,
                "ppo_judge_first": (ppo.get("objective/judge") or [None])[0],
                "ppo_judge_last5": mean(ppo["objective/judge"][-5:]) if ppo.get("objective/judge") else None,
                "ppo_score_last5": mean(ppo["objective/scores"][-5:]) if ppo.get("objective/scores") else None,
                "held_out_judge": metrics.get("judge_mean"),
                "held_out_kl": metrics.get("kl_mean"),
                "held_out_length": metrics.get("length_mean"),
                "held_out_distinct_2": metrics.get("distinct_2"),
            }
            for tag, short in (("response/length", "length"), ("objective/judge", "judge")):
                for i, value in enumerate(ppo.get(tag, [])):  # per rollout (1-based in the table)
                    found[f"rollout_{short}_{i + 1}"] = value
            for key, value in found.items():
                row.setdefault(key, []).append(value)
            row.setdefault("seed", []).append(int(seed))
        rows[variant] = row
    sft_path = os.path.join(args.work, "eval", "sft.json")
    sft = json.load(open(sft_path))["metrics"] if os.path.exists(sft_path) else {}
    keys = [
        "rm_val_accuracy",
        "rm_val_length_correlation",
        "ppo_length_first",
        "ppo_length_last5",
        "ppo_judge_first",
        "ppo_judge_last5",
        "held_out_judge",
        "held_out_kl",
        "held_out_length",
        "held_out_distinct_2",
    ]
    print("| | " + " | ".join(f"{v} (seeds {', '.join(map(str, rows[v].get('seed', [])))})" for v in rows) + " |")
    print("| --- | " + " | ".join("---" for _ in rows) + " |")
    for key in keys:
        print(f"| {key} | " + " | ".join(mean_se(rows[v].get(key, [])) for v in rows) + " |")
    rollouts = sorted({int(k.rsplit("_", 1)[1]) for r in rows.values() for k in r if k.startswith("rollout_length_")})
    if rollouts:
        marks = [r for r in rollouts if r == 1 or r % 10 == 0]
        print("\nPer rollout (PPO's own samples, mean ± standard error over seeds):\n")
        print("| | " + " | ".join(f"rollout {r}" for r in marks) + " |")
        print("| --- | " + " | ".join("---" for _ in marks) + " |")
        for variant in rows:
            for short in ("length", "judge"):
                cells = [mean_se(rows[variant].get(f"rollout_{short}_{r}", [])) for r in marks]
                print(f"| {variant}: {short} | " + " | ".join(cells) + " |")
    if sft:
        print(
            f"\nSFT on the same held-out prompts: judge {sft['judge_mean']:.3f}, length {sft['length_mean']:.1f}, "
            f"distinct-2 {sft['distinct_2']:.3f}"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"variants": rows, "sft": sft}, f, indent=1)


if __name__ == "__main__":
    main()

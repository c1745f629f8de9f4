"""The chat demo over seeds: ``python -m demo.chat_seeds --out logs/chat_study --seeds 0 1 2``.

Runs ``python -m demo.chat_pipeline --seed N --out <out>/seed_N`` for each seed, one after another (each
run takes the machine), reusing a seed's folder whose ``results.json`` a finished run wrote, then writes
``<out>/study.md`` and ``<out>/study.json``: every method's held-out figures as means +- standard errors
over the seeds, each floor of :data:`demo.chat_report.FLOORS` per seed (and whether it held in all), the
reward model's held-out accuracy and each run's wall time.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from demo.chat_plan import DEVICES
from demo.seed_stats import over_seeds
from rlhf_lit.artifacts import write_json_atomically, write_text_atomically
from rlhf_lit.integrity import check_json_file

METRICS = ("judge_mean", "kl_mean", "distinct_2", "length_mean", "ended_fraction", "other_turn_fraction")
"""The per-policy figures of a run's ``results.json`` the study averages."""


def finished(folder: Path) -> dict | None:
    """A seed folder's ``results.json`` when a finished full-budget run wrote it; None when there is none."""
    path = folder / "results.json"
    if not path.exists():
        return None
    outcome = check_json_file(path)
    if outcome.get("tiny"):
        raise SystemExit(f"{path}: a --tiny run's results; delete {folder} or choose another --out")
    return outcome


def run_seed(seed: int, folder: Path, extra: Sequence[str]) -> dict:
    """One ``python -m demo.chat_pipeline`` run (its exit status checked) and its ``results.json``."""
    cmd = [sys.executable, "-m", "demo.chat_pipeline", "--seed", str(seed), "--out", str(folder), *extra]
    print(f"[chat_seeds] seed {seed}: {' '.join(cmd)}", flush=True)
    if subprocess.run(cmd).returncode != 0:
        raise SystemExit(f"[chat_seeds] seed {seed} failed; its log is in {folder / 'logs'}")
    outcome = finished(folder)
    if outcome is None:
        raise SystemExit(f"[chat_seeds] seed {seed}: the run wrote no {folder / 'results.json'}")
    return outcome


def summarise(outcomes: Mapping[int, Mapping]) -> dict:
    """Means +- standard errors over the seeds of each method's figures, the floors per seed, the reward
    model's accuracy and the wall times."""
    methods = sorted({name for o in outcomes.values() for name in o["metrics"]})
    per_method = {
        name: over_seeds([o["metrics"][name] for o in outcomes.values() if name in o["metrics"]], METRICS)
        for name in methods
    }
    floors = {}
    for seed, outcome in outcomes.items():
        for name, floor in outcome["floors"].items():
            floors.setdefault(name, {})[str(seed)] = {"value": floor["value"], "holds": bool(floor["holds"])}
    rows = [{"rm": o["rm_val_accuracy"], "minutes": o["timings_s"]["total"] / 60} for o in outcomes.values()]
    return {
        "seeds": sorted(outcomes),
        "methods": per_method,
        "floors": floors,
        "floors_hold_in_every_seed": {
            name: all(f["holds"] for f in by_seed.values()) for name, by_seed in floors.items()
        },
        "rm_val_accuracy": over_seeds(rows, ["rm"]).get("rm"),
        "wall_minutes": over_seeds(rows, ["minutes"]).get("minutes"),
    }


def _pm(stat: Mapping | None, digits: int = 3) -> str:
    if stat is None:
        return "-"
    se = "" if stat["se"] is None else f" ± {stat['se']:.{digits}f}"
    return f"{stat['mean']:.{digits}f}{se}"


def markdown(summary: Mapping) -> str:
    """``study.md``: the table of means, the floors per seed, the reward model and the times."""
    seeds = summary["seeds"]
    lines = [
        f"# The chat demo over seeds {', '.join(map(str, seeds))}",
        "",
        "Held-out requests, means ± standard errors over the seeds.",
        "",
        "| policy | judge | KL (nats) | distinct-2 | length | ends its turn |",
        "|---|---|---|---|---|---|",
    ]
    for name, stats in summary["methods"].items():
        cells = [_pm(stats.get(k), d) for k, d in (("judge_mean", 3), ("kl_mean", 2), ("distinct_2", 3))]
        cells += [_pm(stats.get("length_mean"), 1), _pm(stats.get("ended_fraction"), 3)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "## Floors per seed", "", "| floor | " + " | ".join(f"seed {s}" for s in seeds) + " | every seed |"]
    lines.append("|---|" + "---|" * (len(seeds) + 1))
    for name, by_seed in summary["floors"].items():
        cells = []
        for s in seeds:
            f = by_seed.get(str(s))
            value = "-" if f is None or f["value"] is None else f"{f['value']:.3f}"
            cells.append("-" if f is None else f"{value} ({'holds' if f['holds'] else 'FAILS'})")
        every = "holds" if summary["floors_hold_in_every_seed"][name] else "FAILS"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {every} |")
    lines += [
        "",
        f"Reward model's held-out pair accuracy: {_pm(summary['rm_val_accuracy'])}.",
        f"Wall time of a run: {_pm(summary['wall_minutes'], 1)} minutes.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the missing seeds, then write the study's table."""
    p = argparse.ArgumentParser(prog="python -m demo.chat_seeds", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the study's folder (one seed_N folder per seed)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--model", default=None, help="SmolLM2-135M-Instruct folder (default: make smollm2's cache)")
    p.add_argument("--device", choices=DEVICES, default="cpu", help="where each run's stages run")
    args = p.parse_args(argv)
    out = Path(args.out)
    extra = ["--device", args.device, *([] if args.model is None else ["--model", args.model])]
    outcomes = {}
    for seed in args.seeds:
        folder = out / f"seed_{seed}"
        outcomes[seed] = finished(folder) or run_seed(seed, folder, extra)
    summary = summarise(outcomes)
    write_json_atomically(out / "study.json", summary)
    write_text_atomically(out / "study.md", markdown(summary))
    print(markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

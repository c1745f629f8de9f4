"""The over-optimisation guard's tests' helpers: a guard callback's config, the metrics a run logged, the guard's lines."""

from __future__ import annotations

import csv
import re
from pathlib import Path

GUARD_LINE = re.compile(r"^\[rlhf-lit\] over-optimisation guard: (\w+) after rollout (\d+): (.+); action: (\w+)")


def guard(**init_args) -> dict:
    """The trainer callback entry of an OverOptimisationGuard with ``init_args``."""
    return {"class_path": "rlhf_lit.callbacks.OverOptimisationGuard", "init_args": init_args}


def logged_metrics(root: Path) -> dict[str, dict[int, float]]:
    """Every logged metric by step, from the CSV logger's file."""
    (path,) = (root / "logs").rglob("metrics.csv")
    out: dict[str, dict[int, float]] = {}
    with open(path, encoding="utf-8") as f:
        for row in csv.DictReader(f):
            for key, value in row.items():
                if key != "step" and value != "":
                    out.setdefault(key, {})[int(row["step"])] = float(value)
    return out


def guard_lines(stderr: str) -> list[tuple[str, int, str]]:
    """(rule, rollout, action) of each guard line in ``stderr``."""
    return [(m[1], int(m[2]), m[4]) for m in map(GUARD_LINE.match, stderr.splitlines()) if m]

"""The demo's markdown summary (``<out>/report/summary.md``) and the tables it prints."""

from __future__ import annotations

import os
from pathlib import Path

from demo.plan import Paths
from demo.runner import Timings


def last_scalar(run: Path, tag: str) -> float | None:
    """The last value of ``tag`` logged in the TensorBoard run ``run`` (None when it was never logged)."""
    from demo.report import read_scalars

    values = read_scalars(str(run)).get(tag, ([], []))[1]
    return values[-1] if values else None


def format_value(value: float | None) -> str:
    """A measured value with 3 decimals, or ``not logged``."""
    return "not logged" if value is None else f"{value:.3f}"


def results_table(results: dict[str, dict]) -> list[str]:
    """Markdown rows: one per evaluated model."""
    lines = [
        "| model | judge mean | KL to SFT (nats) | distinct-1 | distinct-2 | length | ended | n |",
        "|---|---|---|---|---|---|---|---|",
    ]
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
    from demo.report import _cell

    names = list(results)
    lines = ["| # | prompt | " + " | ".join(names) + " |", "|---" * (2 + len(names)) + "|"]
    columns = [results[n]["samples"] for n in names]
    for i in range(min(num_examples, *(len(c) for c in columns))):
        cells = [f"{_cell(c[i]['response'])} ({c[i]['judge']:.2f})" for c in columns]
        lines.append(f"| {i + 1} | {_cell(columns[0][i]['prompt'])} | " + " | ".join(cells) + " |")
    return lines


def write_summary(
    paths: Paths,
    results: dict[str, dict],
    rm_accuracy: float | None,
    rm_records: str,
    report: str,
    timings: Timings,
    frontier: tuple[str, list[str]] | None = None,
    num_examples: int = 6,
) -> Path:
    """``<out>/report/summary.md``: the results table, the frontier, RM accuracy, timings and samples.

    ``rm_records`` says what the RM trained on, e.g. ``"1478 judge-labelled pairs"``.
    """
    md = [
        "# Demo summary",
        "",
        "Held-out prompts (TinyStories paragraphs 3000-3255), one sample each at the "
        "temperature PPO samples with; KL = sum over response tokens of log pi - log pi_SFT.",
        "",
        *results_table(results),
        "",
        f"Reward model held-out pair accuracy: {format_value(rm_accuracy)} ({rm_records} "
        "written; the RM config holds out a seeded fraction)",
        "",
        "Wall time per stage (s): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()),
        "",
        "CPU time per subprocess stage (s): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.cpu.items()),
        "",
        f"Plots and before/after tables: [{os.path.basename(report)}]({os.path.basename(report)})",
        "",
        *(
            []
            if frontier is None
            else [
                "## Frontier: judge score against KL to SFT (held-out prompts)",
                "",
                f"![frontier]({os.path.basename(frontier[0])})",
                "",
                *frontier[1],
                "",
                "PPO, SFT, PPO KL coef 0 and DPO: one completion per held-out prompt, s.e. over completions; "
                "best-of-N: the RM's pick of N SFT samples, exact mean over N-subsets of the drawn samples, "
                "s.e. over prompts, KL = log N - (N-1)/N.",
                "",
            ]
        ),
        "## Samples (same prompts)",
        "",
        *_samples_table(results, num_examples),
        "",
    ]
    path = paths.dir("report") / "summary.md"
    path.write_text("\n".join(md), encoding="utf-8")
    return path

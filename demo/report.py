"""Plots and a markdown summary of a PPO demo run (and optionally a KL=0 run beside it).

Reads TensorBoard scalars logged per rollout (step = rollout index) with tensorboard's
``EventAccumulator`` and draws PNGs with matplotlib's Agg canvas (no display, no pyplot state):

- ``rm_score.png``: ``objective/scores`` (reward model score) over rollouts;
- ``judge_score.png``: ``objective/judge`` (gold judge score) over rollouts;
- ``kl.png``: ``objective/kl`` (per-response KL to the reference) over rollouts;
- ``training_frontier.png``: judge score against KL, one point per rollout (logged during training;
  the pipeline's ``frontier.png`` compares methods on held-out prompts, :mod:`demo.frontier`);
- ``diversity.png`` (``diversity/distinct_1``, ``diversity/distinct_2``) and ``length.png``
  (``response/length``).

A plot whose tag is missing from every run is skipped, with a note in the summary. The summary
``report.md`` also compares :func:`demo.held_out_eval.evaluate` results before and after PPO:
their metrics, and a table of sample generations for the same prompts.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field

from rlhf_lit.integrity import check_json_file

Series = tuple[list[int], list[float]]
"""``(steps, values)`` of one scalar tag, sorted by step."""


@dataclass(frozen=True)
class Plot:
    """One figure: tags drawn over rollouts (``x_tag=None``) or against another tag."""

    filename: str
    title: str
    y_tags: tuple[str, ...]
    ylabel: str
    x_tag: str | None = None
    xlabel: str = "rollout"


PLOTS: tuple[Plot, ...] = (
    Plot("rm_score.png", "Reward model score", ("objective/scores",), "RM score"),
    Plot("judge_score.png", "Gold judge score", ("objective/judge",), "judge score"),
    Plot("kl.png", "KL to the reference", ("objective/kl",), "KL per response (nats)"),
    Plot(
        "training_frontier.png",
        "Judge score against KL during training",
        ("objective/judge",),
        "judge score",
        x_tag="objective/kl",
        xlabel="KL per response (nats)",
    ),
    Plot("diversity.png", "Diversity", ("diversity/distinct_1", "diversity/distinct_2"), "distinct-n"),
    Plot("length.png", "Response length", ("response/length",), "tokens"),
)
"""The figures of a report, in order."""


@dataclass
class Run:
    """A labelled TensorBoard run and its scalars."""

    label: str
    path: str
    scalars: dict[str, Series] = field(default_factory=dict)


def read_scalars(run_dir: str) -> dict[str, Series]:
    """All scalar tags of the TensorBoard event files directly in ``run_dir``.

    When a step was logged more than once (a resumed run), the value logged last wins.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not glob.glob(os.path.join(run_dir, "events.out.tfevents.*")):
        below = sorted(
            {
                os.path.dirname(p)
                for p in glob.glob(os.path.join(run_dir, "**", "events.out.tfevents.*"), recursive=True)
            }
        )
        hint = f"; runs below it: {', '.join(below)}" if below else ""
        raise FileNotFoundError(f"no TensorBoard event files directly in {run_dir}{hint}")
    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})  # 0 keeps every point
    acc.Reload()
    out: dict[str, Series] = {}
    for tag in acc.Tags()["scalars"]:
        by_step = {e.step: e.value for e in acc.Scalars(tag)}
        steps = sorted(by_step)
        out[tag] = (steps, [by_step[s] for s in steps])
    return out


def _paired(x: Series, y: Series) -> Series:
    """``(x values, y values)`` at the steps both series have."""
    xs = dict(zip(*x))
    steps = [s for s in y[0] if s in xs]
    ys = dict(zip(*y))
    return [xs[s] for s in steps], [ys[s] for s in steps]


def draw(plot: Plot, runs: list[Run], path: str) -> list[str]:
    """Draw ``plot`` for every run that has its tags; nothing is written if none has.

    Returns:
        The labels of the runs left out of the figure for lack of a tag.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    drawn, missing = False, []
    for i, run in enumerate(runs):
        for j, tag in enumerate(plot.y_tags):
            if tag not in run.scalars or (plot.x_tag and plot.x_tag not in run.scalars):
                missing += [] if run.label in missing else [run.label]
                continue
            label = run.label if len(plot.y_tags) == 1 else f"{run.label}: {tag.split('/')[-1]}"
            style = dict(color=f"C{i}", linestyle=("-", "--", ":")[j % 3], label=label)
            if plot.x_tag is None:
                ax.plot(*run.scalars[tag], **style)
            else:
                ax.plot(*_paired(run.scalars[plot.x_tag], run.scalars[tag]), marker="o", markersize=3, **style)
            drawn = True
    if not drawn:
        return missing
    ax.set(title=plot.title, xlabel=plot.xlabel, ylabel=plot.ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    return missing


def _cell(text: object) -> str:
    """Text safe inside a markdown table cell (no pipes, no line breaks)."""
    return str(text).replace("|", "\\|").replace("\r", " ").replace("\n", " ").strip()


def _fmt(v: object) -> str:
    return f"{v:.4g}" if isinstance(v, float) else _cell(v)


def curves_table(runs: list[Run]) -> list[str]:
    """Markdown rows: first and last value of every plotted tag, per run."""
    tags = sorted({t for p in PLOTS for t in (*p.y_tags, *([p.x_tag] if p.x_tag else []))})
    head = "| tag | " + " | ".join(f"{r.label} first | {r.label} last" for r in runs) + " |"
    lines = [head, "|---" * (1 + 2 * len(runs)) + "|"]
    for tag in tags:
        cells = []
        for r in runs:
            steps, values = r.scalars.get(tag, ([], []))
            cells += [_fmt(values[0]), _fmt(values[-1])] if values else ["-", "-"]
        lines.append(f"| `{tag}` | " + " | ".join(cells) + " |")
    return lines


def before_after_tables(before: dict, after: dict, num_examples: int) -> list[str]:
    """Markdown: metrics of two evaluate results and samples for prompts both have."""
    keys = [k for k in before["metrics"] if k in after["metrics"]]
    lines = ["| metric | before PPO | after PPO |", "|---|---|---|"]
    lines += [f"| {k} | {_fmt(before['metrics'][k])} | {_fmt(after['metrics'][k])} |" for k in keys]
    # Pair samples by (paragraph, prompt) occurrence so differing orders or counts still match up.
    later = {}
    for s in after["samples"]:
        later.setdefault((s["paragraph"], s["prompt"]), []).append(s)
    lines += ["", "| # | prompt | before PPO (judge) | after PPO (judge) |", "|---|---|---|---|"]
    shown = 0
    for s in before["samples"]:
        match = later.get((s["paragraph"], s["prompt"]))
        if not match or shown >= num_examples:
            continue
        a = match.pop(0)
        shown += 1
        lines.append(
            f"| {shown} | {_cell(s['prompt'])} | {_cell(s['response'])} ({s['judge']:.3f}) "
            f"| {_cell(a['response'])} ({a['judge']:.3f}) |"
        )
    if not shown:
        lines.append("| - | no prompt in common between the two evaluations | | |")
    return lines


def write_report(
    run: str,
    out_dir: str,
    *,
    label: str = "PPO",
    compare: str | None = None,
    compare_label: str = "KL=0",
    before: str | None = None,
    after: str | None = None,
    num_examples: int = 8,
) -> str:
    """Write the PNGs and ``report.md`` into ``out_dir``; returns the markdown path.

    Args:
        run: TensorBoard run directory (the ``version_N`` folder holding the event files).
        out_dir: where the figures and ``report.md`` go.
        label: legend label of ``run``.
        compare: a second run drawn on the same axes (e.g. the KL coefficient 0 run).
        compare_label: legend label of ``compare``.
        before, after: JSON results of ``evaluate`` for the SFT model and the PPO policy.
        num_examples: sample generations shown in the before/after table.
    """
    if (before is None) != (after is None):
        raise ValueError("give both before and after evaluation JSONs, or neither")
    runs = [Run(label, run, read_scalars(run))]
    if compare is not None:
        runs.append(Run(compare_label, compare, read_scalars(compare)))
    os.makedirs(out_dir, exist_ok=True)

    md = ["# PPO demo report", ""]
    md += [f"- {r.label}: `{r.path}` ({len(r.scalars)} scalar tags)" for r in runs]
    md += ["", "## Training curves", ""]
    skipped = []
    for plot in PLOTS:
        missing = draw(plot, runs, os.path.join(out_dir, plot.filename))
        tags = ", ".join(f"`{t}`" for t in (*plot.y_tags, *([plot.x_tag] if plot.x_tag else [])))
        if len(missing) == len(runs):
            skipped.append(f"- {plot.filename} skipped: no run logs {tags}")
            continue
        md += [f"![{plot.title}]({plot.filename})", ""]
        if missing:
            labels = ", ".join(missing)
            skipped.append(f"- {plot.filename}: {labels} not drawn (lacks one of {tags})")
    if skipped:
        md += ["Missing tags:", "", *skipped, ""]
    md += ["## First and last values", "", *curves_table(runs), ""]
    if before is not None:
        before_result = check_json_file(before, want_object=False)
        after_result = check_json_file(after, want_object=False)
        md += [
            "## Before and after PPO (held-out prompts)",
            "",
            f"before: `{before}`, after: `{after}`",
            "",
            *before_after_tables(before_result, after_result, num_examples),
            "",
        ]
    path = os.path.join(out_dir, "report.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(md))
    return path

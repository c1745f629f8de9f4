"""The score-against-KL frontier: policies (and best-of-N settings) as points of a score against their
KL to a reference, from the results of ``rlhf-lit evaluate`` and ``rlhf-lit best-of-n``.

The score is the judge's (``judge``) or the reward model's (``rm``): the reward-KL frontier of a
run's checkpoints (``rlhf-lit export-policy``), of methods, or of settings is drawn over the
evaluation results of each policy on one prompt file, against one reference:

- an evaluation (``rlhf-lit evaluate`` with ``--reference``; :func:`point_from_evaluation`) gives
  one point: the mean per-response KL (a Monte Carlo estimate of ``KL(policy || reference)``) and
  the mean score over its samples, with its standard error ``s / sqrt(n)`` (``s`` the sample
  standard deviation over the ``n`` responses);
- a best-of-N sweep (``rlhf-lit best-of-n``; :func:`points_from_best_of_n`) gives one point per N:
  the analytic ``KL = log N - (N - 1) / N`` and the pick's mean score, its standard error over prompts.

Several results of one setting (seeds) count as one point, their mean (:func:`mean_over_runs`).
:func:`draw_frontier` draws the points of each method joined in the given order, error bars one
standard error, on a KL axis linear up to 10 nats and logarithmic beyond; :func:`frontier_table`
gives the same as markdown rows. Drawing needs matplotlib (``pip install matplotlib``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Score = Literal["judge", "rm"]
"""Which score a point measures: the judge's or the reward model's."""
SCORE_LABELS: dict[str, str] = {"judge": "judge score", "rm": "RM score"}
"""How the table and the plot name each :data:`Score`."""


@dataclass(frozen=True)
class FrontierPoint:
    """One policy (or best-of-N setting) on the frontier: its KL to the reference and its mean score.

    Attributes:
        method: the line it belongs to on the plot (``SFT``, ``PPO``, ``DPO``, ``best-of-N`` ...).
        setting: what distinguishes it within the method (``rollout 10``, ``beta 0.1``, ``N 4``).
        kl: KL to the reference in nats per response (measured, or analytic for best-of-N).
        score: mean score (the judge's or the reward model's).
        score_se: standard error of ``score``.
        n: responses the mean is over (best-of-N: prompts, one pick each).
        kl_analytic: the KL is the analytic best-of-N formula, not a measurement.
        note: extra text for the table (e.g. how many samples best-of-N drew per prompt).
    """

    method: str
    setting: str
    kl: float
    score: float
    score_se: float
    n: int
    kl_analytic: bool = False
    note: str = ""


def standard_error(values: Sequence[float]) -> float:
    """Standard error of the mean: sample standard deviation / sqrt(n) (0 for fewer than 2 values)."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def point_from_evaluation(result: Mapping, method: str, setting: str, score: Score = "judge") -> FrontierPoint:
    """A frontier point from an evaluation result (``rlhf-lit evaluate``'s JSON: its ``samples``).

    Raises:
        ValueError: the result has no samples, or its samples lack the KL (evaluated without a
            reference) or the score (without ``--judge`` / ``--reward-model``), or a sample is not an
            object or holds either as something else than a finite number (a damaged or hand-edited
            file: the message names the sample and the field).
    """
    from rlhf_lit.data.records import Row, get_finite_number

    samples = result["samples"]
    name = method if setting == "-" else f"{method} {setting}"
    if not samples:
        raise ValueError(f"the evaluation of {name} has no samples")
    keys = [("kl", "--reference"), (score, "--judge" if score == "judge" else "--reward-model")]
    for key, option in keys:
        if isinstance(samples[0], Mapping) and key not in samples[0]:
            raise ValueError(f"the evaluation of {name} has no {key!r} per sample (evaluate with {option})")
    values: dict[str, list[float]] = {key: [] for key, _ in keys}
    for i, sample in enumerate(samples):
        if not isinstance(sample, Mapping):
            raise ValueError(f"samples[{i}] must be a JSON object, got {type(sample).__name__}")
        row = Row(f"samples[{i}]", dict(sample))
        for key in values:
            values[key].append(get_finite_number(row, key))  # type: ignore[arg-type]
    return mean_point(method, setting, values["kl"], values[score])


def mean_point(method: str, setting: str, kls: Sequence[float], scores: Sequence[float], **extra) -> FrontierPoint:
    """The point of the mean KL and mean score of ``n = len(scores)`` values, with the score's
    standard error (``extra``: more :class:`FrontierPoint` fields)."""
    mean = sum(scores) / len(scores)
    return FrontierPoint(method, setting, sum(kls) / len(kls), mean, standard_error(scores), len(scores), **extra)


def points_from_best_of_n(result: Mapping, method: str = "best-of-N", score: Score = "judge") -> list[FrontierPoint]:
    """One frontier point per N of an ``rlhf-lit best-of-n`` result.

    Raises:
        ValueError: the sweep has no such score (run without ``--judge``), or a field it is read from is
            missing or of another type (a damaged or hand-edited file: the message names the field).
    """
    from rlhf_lit.data.records import Row, get_finite_number, get_int

    if not isinstance(result["config"], Mapping):
        raise ValueError(f"field 'config' must be a JSON object, got {type(result['config']).__name__}")
    config = Row("config", dict(result["config"]))
    how = "first N" if config.data.get("estimator") == "first_n" else "exact mean over N-subsets"
    num_samples, num_prompts = (get_int(config, key, least=1) for key in ("num_samples", "num_prompts"))
    note = f"{num_samples} samples per prompt, {how}"
    points = []
    for i, values in enumerate(result["rows"]):
        if not isinstance(values, Mapping):
            raise ValueError(f"rows[{i}] must be a JSON object, got {type(values).__name__}")
        row = Row(f"rows[{i}]", dict(values))
        if row.data.get(f"{score}_mean") is None:
            raise ValueError(
                f"the best-of-n result has no {SCORE_LABELS[score]}s"
                + (" (run it with --judge)" if score == "judge" else "")
            )
        mean, se = get_finite_number(row, f"{score}_mean"), get_finite_number(row, f"{score}_stderr")
        kl, n = get_finite_number(row, "kl_analytic"), get_int(row, "n", least=1)
        point = FrontierPoint(method, f"N {n}", kl, mean, se, num_prompts, kl_analytic=True, note=note)  # type: ignore[arg-type]
        points.append(point)
    return points


def mean_over_runs(points: Sequence[FrontierPoint]) -> list[FrontierPoint]:
    """One point per ``(method, setting)``, in first-seen order: the mean over the points that share it.

    Several results of one setting (the same run on several seeds) become their mean KL and mean
    score, the standard error over the results (``s / sqrt(k)`` of the ``k`` per-result scores: the
    spread between runs, not within one), ``n = k`` and the note ``mean over k runs``. A setting with
    one result is kept as it is.
    """
    groups: dict[tuple[str, str], list[FrontierPoint]] = {}
    for p in points:
        groups.setdefault((p.method, p.setting), []).append(p)
    out = []
    for (method, setting), mine in groups.items():
        if len(mine) == 1:
            out.append(mine[0])
            continue
        kls, scores = [p.kl for p in mine], [p.score for p in mine]
        analytic = all(p.kl_analytic for p in mine)
        out.append(mean_point(method, setting, kls, scores, kl_analytic=analytic, note=f"mean over {len(mine)} runs"))
    return out


def frontier_table(
    points: Iterable[FrontierPoint], score_label: str = "judge score", reference: str = "SFT"
) -> list[str]:
    """Markdown rows: method, setting, KL, score +- standard error, responses, note."""
    lines = [
        f"| method | setting | KL to {reference} (nats) | {score_label} +- s.e. | n | note |",
        "|---|---|---|---|---|---|",
    ]
    for p in points:
        kl = f"{p.kl:.2f}" + (" (analytic)" if p.kl_analytic else "")
        lines.append(f"| {p.method} | {p.setting} | {kl} | {p.score:.3f} +- {p.score_se:.3f} | {p.n} | {p.note} |")
    return lines


def draw_frontier(
    points: Sequence[FrontierPoint],
    path: str,
    title: str = "Judge score against KL to SFT",
    ylabel: str = "judge score (held-out prompts)",
    xlabel: str = "KL to SFT (nats per response)",
) -> str:
    """Draw every method's points (joined in the given order, error bars = 1 s.e.) to a PNG; returns ``path``.

    The KL axis is linear up to 10 nats and logarithmic beyond (``symlog``), so best-of-N (at most
    a few nats) and an unpenalised policy (tens of nats) both stay readable. A point's label on
    the plot is the last word of its setting (``rollout 10`` -> ``10``), drawn when its method has
    several points.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("drawing the frontier needs matplotlib: pip install matplotlib") from None

    if not points:
        raise ValueError("no frontier points to draw")
    fig = Figure(figsize=(7, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    methods = list(dict.fromkeys(p.method for p in points))  # first-seen order, for stable colours
    for i, method in enumerate(methods):
        mine = [p for p in points if p.method == method]
        ax.errorbar(
            [p.kl for p in mine],
            [p.score for p in mine],
            yerr=[p.score_se for p in mine],
            color=f"C{i}",
            marker="os^Dv<>p"[i % 8],
            markersize=5,
            capsize=2,
            linestyle="-" if len(mine) > 1 else "none",
            label=method,
        )
        for p in mine:
            if len(mine) > 1:
                ax.annotate(
                    p.setting.split()[-1],
                    (p.kl, p.score),
                    textcoords="offset points",
                    xytext=(4, -10),
                    fontsize=7,
                    color=f"C{i}",
                )
    if max(p.kl for p in points) > 10:
        ax.set_xscale("symlog", linthresh=10)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    return path

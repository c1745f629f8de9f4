"""The guard's rules: pure functions from a metric trajectory to a verdict (no Lightning, no torch).

Each rule reads a list of per-rollout values (``None`` where the run did not log the metric that
rollout) and returns a :class:`Verdict` (does the rule hold now, the value it compared, the
threshold it compared it with) or ``None`` when the signal is not available yet: too few logged
values for its windows, or a metric the run never logs. A signal that is not available never
fires, so a run that cannot produce a signal gets no false alarm.

Three shapes of rule, chosen for noisy per-rollout means (a rollout is a batch of a few dozen
samples; a 0/1 reward's batch mean moves by tenths from rollout to rollout by chance alone):

- :func:`above`: the latest value above a ceiling (the KL per response).
- :func:`line_change`: the change across a window of the least-squares line through it, with its
  t-statistic: a trend, not the difference of two noisy end points. Identical values (a 0/1 reward
  whose every sample is 1: standard deviation 0) have slope 0 and t 0: no trend.
- :func:`drift`: the mean of the last rollouts against the mean of the first ones (the baseline
  window), compared with ``max(relative * |baseline|, absolute)``: the absolute floor is what
  makes a zero baseline (a disagreement or a reward of 0) safe, where any relative change of 0 is
  infinite.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Direction = Literal["up", "down", "either"]
"""Which way a drift counts: a rise, a fall, or either."""


@dataclass(frozen=True)
class Verdict:
    """A rule's answer for one rollout: ``holds`` when ``value`` crossed ``threshold``."""

    holds: bool
    value: float
    threshold: float
    text: str
    """What was compared, in words: ``"KL per response 7.31 > ceiling 5"``."""


def present(values: Sequence[float | None]) -> list[float]:
    """The logged values (``None`` and NaN dropped), in order."""
    return [v for v in values if v is not None and not math.isnan(v)]


def fitted_line(ys: Sequence[float], xs: Sequence[float] | None = None) -> tuple[float, float]:
    """``(slope, t)`` of the least-squares line through ``(xs, ys)`` (``xs`` 0, 1, ... by default).

    ``t`` is the slope over its standard error: 0 for a zero slope, +-inf for points exactly on a
    sloped line (no residual). Needs at least 3 points (one residual degree of freedom).
    """
    n = len(ys)
    if n < 3:
        raise ValueError(f"a fitted line needs at least 3 points, got {n}")
    xs = list(range(n)) if xs is None else list(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys))
    # Residuals below the rounding of the values are no residual: points exactly on a line.
    scale = max(1.0, max(abs(y) for y in ys)) ** 2 * n * 1e-24
    if slope == 0.0:
        return 0.0, 0.0
    if residual <= scale:
        return slope, math.copysign(math.inf, slope)
    return slope, slope / math.sqrt(residual / (n - 2) / sxx)


def above(values: Sequence[float | None], ceiling: float, what: str) -> Verdict | None:
    """Holds when the latest logged value is above ``ceiling``."""
    if not values or values[-1] is None or math.isnan(values[-1]):
        return None
    value = values[-1]
    holds = value > ceiling
    return Verdict(holds, value, ceiling, f"{what} {value:.4g} {'>' if holds else '<='} ceiling {ceiling:.4g}")


def rate_above(values: Sequence[float | None], window: int, max_rate: float, what: str) -> Verdict | None:
    """Holds when the least-squares slope of the last ``window`` logged values (per rollout) is above ``max_rate``."""
    logged = present(values)
    if len(logged) < max(window, 3):
        return None
    slope, _ = fitted_line(logged[-window:])
    return Verdict(
        slope > max_rate,
        slope,
        max_rate,
        f"{what} growing {slope:.4g} per rollout over the last {window} "
        f"{'>' if slope > max_rate else '<='} rate {max_rate:.4g}",
    )


def line_change(ys: Sequence[float], xs: Sequence[float] | None = None) -> tuple[float, float]:
    """``(change, t)``: how much the least-squares line through the points moves from the first x to
    the last (slope times the span), and the slope's t-statistic (:func:`fitted_line`)."""
    xs = list(range(len(ys))) if xs is None else list(xs)
    slope, t = fitted_line(ys, xs)
    return slope * (xs[-1] - xs[0]), t


def falling(values: Sequence[float | None], window: int, min_drop: float, min_t: float, what: str) -> Verdict | None:
    """Holds when the line through the last ``window`` logged values falls by at least ``min_drop``
    across the window with a t-statistic of at most ``-min_t`` (a fall larger than its noise)."""
    logged = present(values)
    if len(logged) < max(window, 3):
        return None
    change, t = line_change(logged[-window:])
    holds = change <= -min_drop and t <= -min_t
    return Verdict(
        holds,
        -change,
        min_drop,
        f"{what} fell {-change:.4g} over the last {window} rollouts (t = {t:.3g}); "
        f"threshold: a fall >= {min_drop:.4g} with t <= -{min_t:.3g}",
    )


def drift(
    values: Sequence[float | None],
    baseline: int,
    window: int,
    direction: Direction,
    relative: float,
    absolute: float,
    what: str,
) -> Verdict | None:
    """Holds when the mean of the last ``window`` logged values moved from the mean of the first
    ``baseline`` ones (``direction``-wise) by more than ``max(relative * |baseline mean|, absolute)``.

    Not available until ``baseline + window`` values are logged (the windows never overlap).
    """
    logged = present(values)
    if len(logged) < baseline + window:
        return None
    base = sum(logged[:baseline]) / baseline
    recent = sum(logged[-window:]) / window
    change = recent - base
    signed = {"up": change, "down": -change, "either": abs(change)}[direction]
    threshold = max(relative * abs(base), absolute)
    holds = signed > threshold
    return Verdict(
        holds,
        signed,
        threshold,
        f"{what} {base:.4g} -> {recent:.4g} (first {baseline} -> last {window} rollouts): "
        f"a change of {change:+.4g}, threshold {direction} by more than {threshold:.4g}",
    )


def proxy_without_gold(
    rollouts: Sequence[int],
    proxy: Sequence[float],
    gold: Sequence[float],
    window: int,
    min_proxy_rise: float,
    max_gold_rise: float,
) -> Verdict | None:
    """Holds when, over the last ``window`` evaluations (at ``rollouts``), the least-squares line of
    the proxy (the RM score) rises by at least ``min_proxy_rise`` while the gold's (the held-out
    judge's) rises by at most ``max_gold_rise``: the reward model buys what the judge does not see."""
    if len(proxy) < max(window, 3):
        return None
    xs = list(rollouts[-window:])
    proxy_rise, _ = line_change(proxy[-window:], xs)
    gold_rise, _ = line_change(gold[-window:], xs)
    holds = proxy_rise >= min_proxy_rise and gold_rise <= max_gold_rise
    text = (
        f"proxy (RM score) rose {proxy_rise:+.4g} (threshold >= {min_proxy_rise:.4g}) while the judge rose "
        f"{gold_rise:+.4g} (threshold <= {max_gold_rise:.4g}) over the last {window} evaluations"
    )
    return Verdict(holds, gold_rise, max_gold_rise, text)


def persistent(streak: int, holds: bool) -> int:
    """The number of consecutive evaluations the rule has held, after this one."""
    return streak + 1 if holds else 0

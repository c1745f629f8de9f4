"""Statistics over seeds shared by the demo's studies: the mean and its standard error, a piecewise-linear
curve read at a point (never extrapolated), and per-key summaries of per-seed rows."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def mean_se(values: Sequence[float]) -> tuple[float, float | None]:
    """``(mean, standard error)`` of ``values``; the error is None for fewer than two values."""
    if not values:
        raise ValueError("mean_se of no values")
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def interpolate(points: Sequence[tuple[float, float]], x: float) -> float | None:
    """The piecewise-linear curve through ``points`` (``(x, y)``, any order) at ``x``; None outside their range.

    No extrapolation: a PPO policy further from SFT than every DPO policy has no DPO value to compare with.
    """
    ordered = sorted(points)
    if not ordered or not ordered[0][0] <= x <= ordered[-1][0]:
        return None
    for (x0, y0), (x1, y1) in zip(ordered, ordered[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ordered[0][1]  # a single point, at x


def over_seeds(rows: Sequence[Mapping], keys: Sequence[str]) -> dict[str, dict]:
    """Per key: ``{"mean", "se", "n"}`` (:func:`mean_se`) over the rows that have it, not None; keys no row has
    are left out."""
    out = {}
    for key in keys:
        values = [row[key] for row in rows if row.get(key) is not None]
        if values:
            mean, se = mean_se(values)
            out[key] = {"mean": mean, "se": se, "n": len(values)}
    return out

"""From judge scores to preference pairs: which samples to pair and which one is chosen.

Two labellers (``Labeler``), chosen in :func:`prefer_first`:

- ``"argmax"``: the higher judge score wins; equal scores are a tie and the pair is dropped.
- ``"bradley_terry"``: a noisy labeller, as human labels are: prefer A with probability
  ``sigmoid((s_A - s_B) / temperature)`` (Bradley and Terry 1952), one seeded uniform draw per
  pair. ``temperature -> 0`` recovers ``argmax`` (ties become coin flips instead of dropped).

Two pairings (``Pairing``) of the K samples of one prompt, chosen in :func:`candidate_pairs`:
``"best_worst"`` (one pair: highest vs lowest score, InstructGPT-style contrast) or
``"all_pairs"`` (all K (K - 1) / 2 pairs, as InstructGPT ranks K completions).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Literal

Labeler = Literal["argmax", "bradley_terry"]
Pairing = Literal["best_worst", "all_pairs"]


def candidate_pairs(scores: Sequence[float], pairing: Pairing) -> list[tuple[int, int]]:
    """Index pairs ``(i, j)``, ``i < j`` for ``all_pairs``, (best, worst) for ``best_worst``.

    ``best_worst`` takes the first index of the maximum and of the minimum; when all scores are
    equal those coincide, and the pair is ``(0, 1)`` (a tie).
    """
    k = len(scores)
    if k < 2:
        raise ValueError(f"need at least 2 samples per prompt to make a pair, got {k}")
    if pairing == "all_pairs":
        return [(i, j) for i in range(k) for j in range(i + 1, k)]
    if pairing == "best_worst":
        best = max(range(k), key=lambda i: scores[i])
        worst = min(range(k), key=lambda i: scores[i])
        return [(0, 1)] if best == worst else [(best, worst)]
    raise ValueError(f"pairing must be 'best_worst' or 'all_pairs', got {pairing!r}")


def bradley_terry_probability(score_a: float, score_b: float, temperature: float) -> float:
    """``sigmoid((score_a - score_b) / temperature)``: the probability that A is preferred."""
    if not temperature > 0:
        raise ValueError(f"Bradley-Terry temperature must be > 0, got {temperature}")
    x = (score_a - score_b) / temperature
    # Two branches so that exp never overflows for large |x|.
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def prefer_first(
    score_a: float, score_b: float, labeler: Labeler, temperature: float, rng: random.Random
) -> bool | None:
    """True if A is chosen over B, False if B is, None for a dropped tie (``argmax`` only).

    ``bradley_terry`` draws exactly one ``rng.random()`` per call (so runs are reproducible and
    the draw count is known); ``argmax`` draws none.
    """
    if labeler == "argmax":
        return None if score_a == score_b else score_a > score_b
    if labeler == "bradley_terry":
        return rng.random() < bradley_terry_probability(score_a, score_b, temperature)
    raise ValueError(f"labeler must be 'argmax' or 'bradley_terry', got {labeler!r}")

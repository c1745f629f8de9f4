"""From judge scores to preferences: which samples to pair and which one is chosen, or how to rank them.

Two labellers (``Labeler``), chosen in :func:`prefer_first`:

- ``"argmax"``: the higher judge score wins; equal scores are a tie and the pair is dropped.
- ``"bradley_terry"``: a noisy labeller, as human labels are: prefer A with probability
  ``sigmoid((s_A - s_B) / temperature)`` (Bradley and Terry 1952), one seeded uniform draw per
  pair. ``temperature -> 0`` recovers ``argmax`` (ties become coin flips instead of dropped).

What the K samples of one prompt become (``Pairing``):

- ``"best_worst"``: one pair, highest vs lowest score (:func:`candidate_pairs`);
- ``"all_pairs"``: all K (K - 1) / 2 pairs as separate pair records (:func:`candidate_pairs`);
- ``"ranking"``: one ranking record holding all K samples ordered best first, as InstructGPT's
  labellers ranked K completions (:func:`rank_samples`). With ``argmax`` the order is by judge
  score and equal scores tie; with ``bradley_terry`` the order is drawn from the Plackett-Luce
  model (Luce 1959, Plackett 1975) with weights ``exp(score / temperature)``: the best is drawn
  among all K with probability proportional to its weight, the second among the rest, and so on,
  ``K - 1`` seeded uniform draws. For K = 2 that is exactly the Bradley-Terry labeller above
  (``exp(a/T) / (exp(a/T) + exp(b/T)) = sigmoid((a - b) / T)``), and ``temperature -> 0`` gives
  the score order (equal scores then fall in a uniformly random order, not tied).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Literal

from rlhf_lit.data.rankings import order_by_scores

Labeler = Literal["argmax", "bradley_terry"]
Pairing = Literal["best_worst", "all_pairs", "ranking"]


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
    raise ValueError(f"pairing must be 'best_worst' or 'all_pairs' to make pairs, got {pairing!r}")


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


def plackett_luce_order(scores: Sequence[float], temperature: float, rng: random.Random) -> list[int]:
    """A seeded Plackett-Luce draw of an order of ``scores`` (indices, best first).

    Each place is drawn among the samples not yet placed with probability proportional to
    ``exp(score / temperature)``: exactly ``len(scores) - 1`` calls of ``rng.random()`` (the last
    place is what is left).
    """
    if not temperature > 0:
        raise ValueError(f"Plackett-Luce temperature must be > 0, got {temperature}")
    left = list(range(len(scores)))
    order = []
    while len(left) > 1:
        top = max(scores[i] for i in left)
        # Shifted by the largest score so that exp never overflows; the ratios are unchanged.
        weights = [math.exp((scores[i] - top) / temperature) for i in left]
        target = rng.random() * sum(weights)
        cumulative, pick = 0.0, len(left) - 1
        for n, weight in enumerate(weights):
            cumulative += weight
            if target < cumulative:
                pick = n
                break
        order.append(left.pop(pick))
    return order + left


def rank_samples(
    scores: Sequence[float], labeler: Labeler, temperature: float, rng: random.Random
) -> tuple[list[int], list[int]]:
    """``(order, ranks)``: the samples' indices best first and their ranks (lower = better, equal = tie).

    ``argmax``: by score, highest first (equal scores keep their sample order and share a rank,
    :func:`rlhf_lit.data.rankings.order_by_scores`), no draw. ``bradley_terry``: :func:`plackett_luce_order`,
    a strict order (ranks ``0 .. K - 1``), ``K - 1`` draws.
    """
    if len(scores) < 2:
        raise ValueError(f"need at least 2 samples per prompt to rank, got {len(scores)}")
    if labeler == "argmax":
        return order_by_scores(scores)
    if labeler == "bradley_terry":
        return plackett_luce_order(scores, temperature, rng), list(range(len(scores)))
    raise ValueError(f"labeler must be 'argmax' or 'bradley_terry', got {labeler!r}")

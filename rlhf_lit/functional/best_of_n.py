"""Best-of-N sampling: the analytic KL and which of M samples a best-of-N pick selects.

Best-of-N draws N responses from a policy and keeps the one the reward model scores highest. Its
KL to the sampling policy is ``log N - (N - 1) / N`` (Stiennon et al. 2020, appendix G.3; Hilton &
Gao, "Measuring Goodhart's law"), an upper bound that is exact for continuous reward scores.

The pick of N is evaluated on M >= N samples of a prompt in one of two ways (``(P, M)`` weights,
one row per prompt, summing to 1 per row, to average any per-sample quantity):

- :func:`subset_weights` (``"subsets"``): the exact expectation over all ``C(M, N)`` N-subsets of
  the M samples, drawn uniformly. Rank the samples by reward from 1 (worst) to M (best); sample
  i is the best of a random N-subset iff the subset holds it and N - 1 of the ``rank_i - 1``
  samples below it, so ``P(i chosen) = C(rank_i - 1, N - 1) / C(M, N)``. Unbiased for best-of-N
  and with less variance than one N-subset.
- :func:`first_n_weights` (``"first_n"``): the best of the first N samples (nested prefixes:
  best-of-2 sees samples 0-1, best-of-4 samples 0-3, ...): one draw of best-of-N per prompt.

Ties in the reward: the sample drawn earlier (lower index) counts as better, in both.
Pure tensor math; imports torch only.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

BestOfNEstimator = Literal["subsets", "first_n"]
"""How a best-of-N pick is evaluated on M samples (see the module docstring)."""


def best_of_n_kl(n: int) -> float:
    """The analytic KL of best-of-``n`` to the sampling policy: ``log n - (n - 1) / n`` (0 for n = 1)."""
    if n < 1:
        raise ValueError(f"best-of-N needs N >= 1, got {n}")
    return math.log(n) - (n - 1) / n


def reward_ranks(scores: torch.Tensor) -> torch.Tensor:
    """``(P, M)`` rank of each sample within its row: 1 = lowest score, M = highest.

    Ties: the sample with the lower index ranks higher (it is the one picked).

    Args:
        scores: ``(P, M)`` finite reward scores, one row per prompt.
    """
    if scores.dim() != 2:
        raise ValueError(f"scores must be (prompts, samples), got shape {tuple(scores.shape)}")
    if not torch.isfinite(scores).all():
        raise ValueError("reward scores must be finite to rank them")
    m = scores.shape[1]
    # Stable descending sort: equal scores keep index order, so the lower index comes first (better).
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices  # (P, M), best first
    ranks_in_order = torch.arange(m, 0, -1, device=scores.device).expand_as(order)  # (P, M): M, M-1, ..., 1
    return torch.empty_like(order).scatter_(1, order, ranks_in_order)  # (P, M)


def subset_weights(scores: torch.Tensor, n: int) -> torch.Tensor:
    """``(P, M)`` float64: the probability that each sample is the best-of-``n`` of a random n-subset.

    ``P(i chosen) = C(rank_i - 1, n - 1) / C(M, n)`` with ranks from :func:`reward_ranks`.
    """
    m = scores.shape[-1]
    if not 1 <= n <= m:
        raise ValueError(f"best-of-{n} needs 1 <= N <= {m} samples per prompt")
    total = math.comb(m, n)
    # Exact integers, one rounding each: C(63, 31) / C(64, 32) stays exact to float64 precision.
    by_rank = torch.tensor([math.comb(r - 1, n - 1) / total for r in range(1, m + 1)], dtype=torch.float64)  # (M,)
    return by_rank.to(scores.device)[reward_ranks(scores) - 1]  # (P, M)


def first_n_weights(scores: torch.Tensor, n: int) -> torch.Tensor:
    """``(P, M)`` float64 one-hot: the highest-scoring of the first ``n`` samples of each row."""
    m = scores.shape[-1]
    if not 1 <= n <= m:
        raise ValueError(f"best-of-{n} needs 1 <= N <= {m} samples per prompt")
    ranks = reward_ranks(scores[:, :n])  # (P, n): rank n is the pick (lower index wins ties)
    chosen = (ranks == n).to(torch.float64)  # (P, n)
    return torch.nn.functional.pad(chosen, (0, m - n))  # (P, M)


def best_of_n_weights(scores: torch.Tensor, n: int, estimator: BestOfNEstimator = "subsets") -> torch.Tensor:
    """``(P, M)`` weights of the best-of-``n`` pick under ``estimator`` (the one place it is chosen)."""
    if estimator == "subsets":
        return subset_weights(scores, n)
    if estimator == "first_n":
        return first_n_weights(scores, n)
    raise ValueError(f"best-of-N estimator must be 'subsets' or 'first_n', got {estimator!r}")

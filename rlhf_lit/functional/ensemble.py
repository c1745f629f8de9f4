"""Aggregating the scores of a reward-model ensemble into one score per response.

Coste et al. 2023, "Reward Model Ensembles Help Mitigate Overoptimization": the policy optimises a
conservative aggregate of M reward models' scores instead of one model's. The members' scores are
each normalised first (their own gain and bias on the reference set), so the std and the minimum
compare members on one scale.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

Aggregate = Literal["mean", "uncertainty_weighted", "worst_case"]
"""How member scores ``(B, M)`` become one score ``(B,)``: ``mean`` over members;
``uncertainty_weighted``: ``mean - lam * std`` (the population std over members, divisor M; Coste et al.'s
UWO); ``worst_case``: the minimum over members (Coste et al.'s WCO)."""

AGGREGATES: tuple[str, ...] = get_args(Aggregate)


def member_std(member_scores: torch.Tensor) -> torch.Tensor:
    """The population std (divisor M) of each row's member scores: ``(B, M) -> (B,)``; 0 for M = 1."""
    return member_scores.std(dim=1, unbiased=False)  # (B,)


def aggregate_scores(member_scores: torch.Tensor, aggregate: Aggregate, lam: float = 0.0) -> torch.Tensor:
    """One score per row from the members' scores.

    Args:
        member_scores: ``(B, M)`` normalised scores, member m in column m.
        aggregate: see :data:`Aggregate`.
        lam: the weight of the std in ``uncertainty_weighted`` (>= 0; unused by the others).

    Returns:
        ``(B,)`` the aggregated scores.
    """
    if member_scores.dim() != 2:
        raise ValueError(f"member_scores must be (B, M), got shape {tuple(member_scores.shape)}")
    if lam < 0:
        raise ValueError(f"the uncertainty weight lambda must be >= 0, got {lam}")
    if aggregate == "mean":
        return member_scores.mean(dim=1)  # (B,)
    if aggregate == "uncertainty_weighted":
        return member_scores.mean(dim=1) - lam * member_std(member_scores)  # (B,)
    if aggregate == "worst_case":
        return member_scores.min(dim=1).values  # (B,)
    raise ValueError(f"aggregate must be one of {', '.join(AGGREGATES)}; got {aggregate!r}")

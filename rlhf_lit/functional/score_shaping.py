"""From the raw score of each response to the score that enters the per-token reward."""

from __future__ import annotations

from typing import Literal

import torch

from rlhf_lit.functional.masked_stats import Reducer, masked_mean_var

ScoreWhitening = Literal["none", "scores", "rewards"]
"""``scores``: standardise the scores over the rollout batch (mean 0, std 1); ``rewards``: scale the
KL-shaped per-token rewards to unit std without re-centring (N detail 12, TRL's
``whiten_rewards``; done after the KL shaping, not here); ``none``: use them as they are."""


def shape_scores(
    raw_scores: torch.Tensor,
    ended: torch.Tensor,
    bias: float = 0.0,
    whiten: ScoreWhitening = "none",
    clip: float | None = None,
    missing_eos_penalty: float | None = None,
    reduce_sum: Reducer | None = None,
) -> torch.Tensor:
    """Bias, score whitening, clipping and the missing-EOS penalty, in that order.

    Args:
        raw_scores: ``(B,)`` the raw score of each response (e.g. the reward model's).
        ended: ``(B,)`` bool, the response contains EOS.
        bias: subtracted from every score.
        whiten: ``scores`` standardises over the batch (unbiased std, + 1e-8; the two-pass
            statistics of :func:`~rlhf_lit.functional.masked_stats.masked_mean_var`); other values
            leave the scores as they are here.
        clip: clip to ``[-clip, clip]`` after whitening; None = no clipping.
        missing_eos_penalty: a response that did not end gets this score INSTEAD of its own
            (replace, not add); None = no penalty.
        reduce_sum: sums over the processes of a data-parallel run
            (:data:`~rlhf_lit.functional.masked_stats.Reducer`): the whitening mean and std are
            then those of every process's scores; None = the scores given.

    Returns:
        ``(B,)`` the scores that enter the reward.

    Raises:
        ValueError: ``whiten="scores"`` with fewer than 2 scores (over every process).
    """
    scores = raw_scores - bias  # (B,)
    if whiten == "scores":
        every = torch.ones_like(scores, dtype=torch.bool)  # (B,)
        mean, var = masked_mean_var(scores, every, unbiased=True, reduce_sum=reduce_sum)  # () x2
        scores = (scores - mean) / (var.sqrt() + 1e-8)  # (B,)
    if clip is not None:
        scores = scores.clamp(-clip, clip)  # (B,)
    if missing_eos_penalty is not None:
        penalty = torch.full_like(scores, missing_eos_penalty)  # (B,)
        scores = torch.where(ended, scores, penalty)  # (B,)
    return scores

"""From the raw score of each response to the score that enters the per-token reward."""

from __future__ import annotations

from typing import Literal

import torch

__all__ = ["ScoreWhitening", "shape_scores"]

ScoreWhitening = Literal["none", "scores", "rewards"]
"""``scores``: standardise the scores over the rollout batch (mean 0, std 1); ``rewards``: scale the
KL-shaped per-token rewards to unit std without re-centring (N details #12, TRL's
``whiten_rewards``; done after the KL shaping, not here); ``none``: use them as they are."""


def shape_scores(
    raw_scores: torch.Tensor,
    ended: torch.Tensor,
    bias: float = 0.0,
    whiten: ScoreWhitening = "none",
    clip: float | None = None,
    missing_eos_penalty: float | None = None,
) -> torch.Tensor:
    """Bias, score whitening, clipping and the missing-EOS penalty, in that order.

    Args:
        raw_scores: ``(B,)`` the raw score of each response (e.g. the reward model's).
        ended: ``(B,)`` bool, the response contains EOS.
        bias: subtracted from every score.
        whiten: ``scores`` standardises over the batch (unbiased std, + 1e-8); other values leave
            the scores as they are here.
        clip: clip to ``[-clip, clip]`` after whitening; None = no clipping.
        missing_eos_penalty: a response that did not end gets this score INSTEAD of its own
            (replace, not add); None = no penalty.

    Returns:
        ``(B,)`` the scores that enter the reward.
    """
    scores = raw_scores - bias  # (B,)
    if whiten == "scores":
        scores = (scores - scores.mean()) / (scores.std() + 1e-8)  # (B,)
    if clip is not None:
        scores = scores.clamp(-clip, clip)  # (B,)
    if missing_eos_penalty is not None:
        penalty = torch.full_like(scores, missing_eos_penalty)  # (B,)
        scores = torch.where(ended, scores, penalty)  # (B,)
    return scores

"""ODIN's length-disentangling terms for a two-head reward model (Chen et al., ICML 2024).

The reward model has a quality head and a length head on one trunk; the preference loss is taken on
their sum, and two terms shape what each head carries:

- the correlation term ``|rho(quality, L)| - rho(length_score, L)``: the length head is pushed to
  correlate with the response length ``L`` and the quality head to be uncorrelated with it, ``rho``
  being Pearson's correlation over the responses of the batch;
- the orthogonality term ``|cos(w_quality, w_length)|``: the two heads' weight vectors are pushed
  apart, so the quality head cannot read the trunk's length direction (the paper writes
  ``|W_Q^T W_L|``; its reference code takes the inner product of the unit-normalised weights, as here,
  which makes the term blind to the heads' scale).

Only the quality head is the reward used downstream.
"""

from __future__ import annotations

import torch

PEARSON_EPS = 1e-6
"""Added under the square root of Pearson's denominator, ``sum(xc^2) * sum(yc^2)``: a batch whose
scores (or lengths) are all equal has correlation 0 and a finite gradient instead of 0/0."""


def batch_pearson(x: torch.Tensor, y: torch.Tensor, eps: float = PEARSON_EPS) -> torch.Tensor:
    """Pearson's correlation of two ``(N,)`` vectors, ``()``, differentiable, computed in float32
    (or float64 when given float64).

    ``sum(xc * yc) / sqrt(sum(xc^2) * sum(yc^2) + eps)`` with ``xc = x - mean(x)``; ``eps`` only
    matters when one of the two is constant (see :data:`PEARSON_EPS`).
    """
    if x.dim() != 1 or x.shape != y.shape:
        raise ValueError(
            f"batch_pearson takes two (N,) vectors of one length, got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    dtype = torch.float64 if torch.float64 in (x.dtype, y.dtype) else torch.float32
    xc = x.to(dtype) - x.to(dtype).mean()  # (N,)
    yc = y.to(dtype) - y.to(dtype).mean()  # (N,)
    return (xc * yc).sum() / torch.sqrt((xc * xc).sum() * (yc * yc).sum() + eps)  # ()


def length_correlation_loss(
    quality: torch.Tensor, length_score: torch.Tensor, lengths: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ODIN's correlation term over a batch of responses, and the two correlations it is made of.

    Args:
        quality: ``(N,)`` the quality head's score of each response.
        length_score: ``(N,)`` the length head's score of the same responses.
        lengths: ``(N,)`` each response's length (tokens), the target the length head should carry.

    Returns:
        ``(loss, rho_quality, rho_length)``, each ``()``: ``|rho_quality| - rho_length``.
    """
    rho_quality = batch_pearson(quality, lengths)  # ()
    rho_length = batch_pearson(length_score, lengths)  # ()
    return rho_quality.abs() - rho_length, rho_quality, rho_length


def head_orthogonality(quality_weight: torch.Tensor, length_weight: torch.Tensor) -> torch.Tensor:
    """``|cos|`` of the angle between the two heads' ``(D,)`` weight vectors, ``()``, in [0, 1]
    (computed in float32 at least: 16-bit weights are cast up)."""
    dtype = torch.promote_types(torch.promote_types(quality_weight.dtype, length_weight.dtype), torch.float32)
    q = quality_weight.to(dtype)
    w = length_weight.to(dtype)
    norms = (q.norm() * w.norm()).clamp_min(1e-12)  # () a zero head has no direction: 0, not NaN
    return (q @ w).abs() / norms

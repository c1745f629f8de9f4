"""Calibrated rewards: a response's score replaced by its quantile among the scores of reference
samples for the same prompt, then transformed (BoNBoN, Gui et al. 2024; InfAlign, Balashankar et
al. 2025: "calibrate-and-transform RL").

The quantile of a score ``s`` among ``K`` reference scores is read from the pooled sample of the
``K + 1`` scores (the references and ``s`` itself, which under the reference policy is one more
draw of the same distribution). Of that pooled sample, ``below`` references lie strictly under
``s`` and ``ties`` equal it, so its empirical CDF jumps at ``s`` from

    lower = below / (K + 1)          (P(X < s))
    upper = (below + ties + 1) / (K + 1)   (P(X <= s), ``s`` itself counted)

and the calibrated value is the mid-point (the mid-distribution function, the mid-rank of ties):

    quantile = (below + ties / 2 + 1 / 2) / (K + 1)

It lies in ``[0.5 / (K + 1), (K + 0.5) / (K + 1)]``: never 0 (a score below every reference gets
``0.5 / (K + 1)``, so ``log`` stays finite) and never 1, symmetric between the ends; a score equal
to every reference gets 1/2. Under the reference policy its expectation is exactly 1/2 (mid-ranks
of an exchangeable sample), ties included.

The transforms (:data:`CalibrationTransform`, :func:`transform_quantiles`):

- ``identity``: the quantile, a reward in ``(0, 1)``: the probability of beating a reference sample.
- ``log``: ``log quantile``. With a continuous reward, the optimum of ``E[log F(r)] - KL / (n - 1)``
  is the best-of-n policy ``n pi_ref F^(n-1)`` (Gui et al. 2024, Theorem 1). For a discrete
  distribution (atoms, ties) it is exact for n = 2 with the mid-point (``F + F-`` is what
  ``F^2 - F-^2 = (F - F-)(F + F-)`` leaves), an approximation for n > 2.
- ``best_of_n``: ``log`` of the value in ``[lower, upper]`` that makes the optimum with KL
  coefficient ``1 / (n - 1)`` the best-of-n policy for any distribution, atoms and ties included:
  ``(1 / (n - 1)) log((upper^n - lower^n) / (n (upper - lower)))`` (best-of-n picks a draw at the
  atom ``[lower, upper]`` with probability ``upper^n - lower^n``; the mean value theorem puts the
  ``(n - 1)``-th root of ``(upper^n - lower^n) / (n (upper - lower))`` inside the atom). It tends to
  ``log upper`` as the atom shrinks, and equals ``log`` of the mid-point for n = 2.

Pure tensor math; imports torch only.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

CalibrationTransform = Literal["identity", "log", "best_of_n"]
"""What the calibrated quantile becomes (see the module docstring): ``identity``, ``log`` (the
best-of-n target with KL coefficient ``1 / (n - 1)``, exact for continuous rewards) or ``best_of_n``
(exact for any reward distribution; needs n)."""

CALIBRATION_TRANSFORMS: tuple[str, ...] = get_args(CalibrationTransform)


def quantile_bounds(scores: torch.Tensor, reference_scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lower, upper)``, each ``(B,)`` float64: where the empirical CDF of the pooled ``K + 1`` scores
    (row b's ``K`` references and ``scores[b]``) jumps at ``scores[b]``.

    ``lower = below / (K + 1)``, ``upper = (below + ties + 1) / (K + 1)``, with ``below`` the references
    strictly under the score and ``ties`` those equal to it (exact float equality: scores are compared,
    never rounded).

    Args:
        scores: ``(B,)`` finite scores of the responses to calibrate.
        reference_scores: ``(B, K)`` finite scores of ``K`` reference samples of each row's prompt.
    """
    if reference_scores.dim() != 2 or scores.dim() != 1 or reference_scores.shape[0] != scores.shape[0]:
        raise ValueError(
            f"scores (B,) and reference_scores (B, K) expected, got {tuple(scores.shape)} and "
            f"{tuple(reference_scores.shape)}"
        )
    if reference_scores.shape[1] < 1:
        raise ValueError("calibration needs at least one reference sample per prompt")
    if not (torch.isfinite(scores).all() and torch.isfinite(reference_scores).all()):
        raise ValueError("scores to calibrate must be finite (a non-finite score has no quantile)")
    pooled = reference_scores.shape[1] + 1  # K + 1
    column = scores.unsqueeze(1)  # (B, 1)
    below = (reference_scores < column).sum(1).to(torch.float64)  # (B,)
    ties = (reference_scores == column).sum(1).to(torch.float64)  # (B,)
    return below / pooled, (below + ties + 1) / pooled  # (B,) x2


def reference_quantiles(scores: torch.Tensor, reference_scores: torch.Tensor) -> torch.Tensor:
    """``(B,)`` float64 mid-quantile of each score among its row's reference scores:
    ``(below + ties / 2 + 1 / 2) / (K + 1)``, the mid-point of :func:`quantile_bounds`."""
    lower, upper = quantile_bounds(scores, reference_scores)  # (B,) x2
    return (lower + upper) / 2  # (B,)


def transform_quantiles(
    lower: torch.Tensor, upper: torch.Tensor, transform: CalibrationTransform, n: int | None = None
) -> torch.Tensor:
    """The calibrated reward of an atom ``[lower, upper]`` of the reference CDF (float64, shape of ``lower``).

    Args:
        lower: ``P(X < s)``, in ``[0, 1)``.
        upper: ``P(X <= s)``, in ``(lower, 1]``.
        transform: ``identity`` (the mid-point), ``log`` (its log) or ``best_of_n`` (see the module
            docstring), the one place the choice is read.
        n: best-of-n's n (>= 2), for ``best_of_n`` only.
    """
    lower, upper = lower.to(torch.float64), upper.to(torch.float64)
    if transform == "identity":
        return (lower + upper) / 2
    if transform == "log":
        return torch.log((lower + upper) / 2)
    if transform == "best_of_n":
        if n is None or n < 2:
            raise ValueError(f"the best_of_n transform needs n >= 2 (its KL coefficient is 1 / (n - 1)), got {n}")
        # (upper^n - lower^n) / (n (upper - lower)) = (1/n) sum_j upper^j lower^(n-1-j): the sum has no
        # cancellation, so a narrow atom keeps its precision (the difference quotient would lose it).
        terms = torch.stack([upper**j * lower ** (n - 1 - j) for j in range(n)])  # (n, ...)
        return torch.log(terms.sum(0) / n) / (n - 1)
    raise ValueError(f"calibration transform must be one of {', '.join(CALIBRATION_TRANSFORMS)}; got {transform!r}")


def calibrated_scores(
    scores: torch.Tensor, reference_scores: torch.Tensor, transform: CalibrationTransform, n: int | None = None
) -> torch.Tensor:
    """``(B,)`` float32: each score replaced by its transformed quantile among its row's ``K`` reference
    scores (:func:`quantile_bounds`, then :func:`transform_quantiles`)."""
    lower, upper = quantile_bounds(scores, reference_scores)  # (B,) x2
    return transform_quantiles(lower, upper, transform, n).to(torch.float32)  # (B,)

"""Statistics over the positions a boolean mask selects (True = the position counts)."""

from __future__ import annotations

import torch

__all__ = ["masked_mean", "masked_var", "masked_whiten", "explained_variance"]


def masked_mean(
    x: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None
) -> torch.Tensor:
    """Mean of ``x`` over the positions where ``mask`` is True.

    Args:
        x: values, any shape, e.g. ``(B, T)``.
        mask: bool, broadcastable to ``x``; True where a position counts.
        dim: reduce over these dims only; ``None`` reduces over everything.

    Returns:
        0-dim tensor (``dim=None``) or ``x`` reduced over ``dim``.
        An empty mask (or an empty slice along ``dim``) gives NaN (0 / 0): this function is on
        the hot path of the losses, so it does no host-side check (no device sync).
    """
    # torch.where rather than x * mask: garbage (inf / nan) in padding must not leak into the sum.
    total = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum(dim=dim)
    count = mask.expand_as(x).sum(dim=dim)  # same shape as total
    return total / count


def _masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool) -> torch.Tensor:
    """Masked variance without the emptiness checks (no device sync); NaN when undefined."""
    mean = masked_mean(x, mask)  # ()
    zero = torch.zeros((), dtype=x.dtype, device=x.device)  # ()
    centered_sq = torch.where(mask, (x - mean) ** 2, zero)  # (B, T)
    count = mask.expand_as(x).sum()  # ()
    var = centered_sq.sum() / count  # ()
    if unbiased:
        # Bessel's correction n / (n - 1): the mean was estimated from the same samples.
        var = var * count / (count - 1)  # ()
    return var


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``x`` over the positions where ``mask`` is True.

    Args:
        x: values, e.g. ``(B, T)``.
        mask: bool, broadcastable to ``x``.
        unbiased: apply Bessel's correction ``n / (n - 1)``.

    Returns:
        0-dim tensor.

    Raises:
        ValueError: the mask selects nothing, or ``unbiased`` with a single selected element.
        (The check reads the count on the host: call this once per rollout, not per token.)
    """
    count = int(mask.expand_as(x).sum())
    if count == 0:
        raise ValueError("masked_var: the mask has no True position; the variance is undefined.")
    if unbiased and count == 1:
        raise ValueError(
            "masked_var: unbiased variance needs at least 2 masked elements, got 1 "
            "(pass unbiased=False for the population variance)."
        )
    return _masked_var(x, mask, unbiased)


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, keep_mean: bool = False, eps: float = 1e-8
) -> torch.Tensor:
    """Shift and scale ``x`` to mean 0 and unit (unbiased) variance over the masked positions.

    Args:
        x: values, e.g. advantages ``(B, T)``.
        mask: bool, same shape as ``x``.
        keep_mean: add the masked mean back after scaling (only the spread is normalised).
        eps: added to the variance before the square root, guarding against zero variance.

    Returns:
        Tensor shaped like ``x``; positions where ``mask`` is False hold 0.

    Raises:
        ValueError: fewer than 2 masked elements (see :func:`masked_var`).
    """
    mean = masked_mean(x, mask)  # ()
    var = masked_var(x, mask, unbiased=True)  # ()
    whitened = (x - mean) * torch.rsqrt(var + eps)  # (B, T)
    if keep_mean:
        whitened = whitened + mean  # (B, T)
    return torch.where(mask, whitened, torch.zeros((), dtype=x.dtype, device=x.device))  # (B, T)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Fraction of the spread of ``returns`` the value head explains.

    ``1 - Var[returns - values] / Var[returns]``.

    Both variances are population variances (``unbiased=False``) over the masked positions.
    1 is a perfect value function, 0 is no better than predicting the mean, negative is worse.

    Args:
        values: value predictions ``(B, T)``.
        returns: GAE returns ``(B, T)``.
        mask: bool ``(B, T)``.

    Returns:
        0-dim tensor. NaN when ``Var[returns] == 0`` or the mask is empty (the ratio is undefined;
        same convention as cleanrl). No host sync, so it is safe to log every step.
    """
    var_returns = _masked_var(returns, mask, unbiased=False)  # ()
    var_residual = _masked_var(returns - values, mask, unbiased=False)  # ()
    nan = torch.full_like(var_returns, float("nan"))  # ()
    # The division is evaluated on both branches; where() only picks which result to keep.
    return torch.where(var_returns == 0, nan, 1 - var_residual / var_returns)  # ()

"""Statistics over the positions a boolean mask selects (True = the position counts).

**Over several processes.** The whitening statistics (:func:`masked_mean_var`,
:func:`masked_whiten`) take an optional ``reduce_sum``: a :data:`Reducer` that sums a tensor over
the processes of a data-parallel run. With it, the mean and variance are those of every process's
masked values together (the global batch), so the result does not depend on how the batch was
split; without it, those of the values given. This module stays torch-only: the caller builds the
reducer (e.g. from its distributed strategy).

The statistics are two-pass (the mean first, then the centered sum of squares), as on one process:
two sums over the processes, the partial sums added in float64. With an identity reducer the
result is bit for bit that of ``reduce_sum=None`` (every float32 partial sum survives the float64
round trip unchanged).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Reducer = Callable[[torch.Tensor], torch.Tensor]
"""Sums a tensor over every process of a data-parallel run and returns the sum, the same on every
process; it must not change its argument (e.g. ``torch.distributed.all_reduce`` on a copy). Every
process must call it the same number of times, in the same order."""


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
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


def _sum_over(local: torch.Tensor, reduce_sum: Reducer | None) -> torch.Tensor:
    """``local`` summed over the processes, in float64 (``local`` itself without a reducer).

    float64 holds a float32 partial sum and a token count exactly, so the processes' parts add
    with one rounding at the end, and one process gets its own values back unchanged.
    """
    if reduce_sum is None:
        return local
    return reduce_sum(local.double())


def masked_mean_var(
    x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True, reduce_sum: Reducer | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and variance of ``x`` over the positions where ``mask`` is True, on every process given.

    Two passes, each one sum over the processes (``reduce_sum``): the masked sum and the count
    give the mean, then the sum of squared deviations from it gives the variance. The operations
    are those of :func:`masked_mean` and :func:`masked_var`, in ``x``'s dtype, so without a
    reducer (or with one process) the results are theirs bit for bit.

    Args:
        x: values, e.g. ``(B, T)``.
        mask: bool, broadcastable to ``x``.
        unbiased: apply Bessel's correction ``n / (n - 1)`` (n counted over every process).
        reduce_sum: sums a tensor over the processes (:data:`Reducer`); None = this batch only.

    Returns:
        ``(mean, var)``, two 0-dim tensors of ``x``'s dtype, the same on every process.

    Raises:
        ValueError: the mask selects nothing, or ``unbiased`` with a single selected element
            (counted over every process, so every process raises together). The check reads the
            count on the host: call this once per rollout, not per token.
    """
    zero = torch.zeros((), dtype=x.dtype, device=x.device)  # ()
    # torch.where rather than x * mask: garbage (inf / nan) in padding must not leak into the sum.
    local = torch.stack(
        [torch.where(mask, x, zero).sum().to(torch.float64), mask.expand_as(x).sum().to(torch.float64)]
    )  # (2,) sum, count
    total, count = _sum_over(local, reduce_sum).unbind()  # () x2
    count = count.to(torch.int64)  # () exact: a count is an integer below 2**53
    n = int(count)
    where = " over every process" if reduce_sum is not None else ""
    if n == 0:
        raise ValueError(f"masked_var: the mask has no True position{where}; the variance is undefined.")
    if unbiased and n == 1:
        raise ValueError(
            f"masked_var: unbiased variance needs at least 2 masked elements{where}, got 1 "
            "(pass unbiased=False for the population variance)."
        )
    mean = total.to(x.dtype) / count  # ()
    centered_sq = torch.where(mask, (x - mean) ** 2, zero).sum()  # ()
    var = _sum_over(centered_sq.to(torch.float64), reduce_sum).to(x.dtype) / count  # ()
    if unbiased:
        # Bessel's correction n / (n - 1): the mean was estimated from the same samples.
        var = var * count / (count - 1)  # ()
    return mean, var


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
    return masked_mean_var(x, mask, unbiased)[1]


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, keep_mean: bool = False, eps: float = 1e-8, reduce_sum: Reducer | None = None
) -> torch.Tensor:
    """Shift and scale ``x`` to mean 0 and unit (unbiased) variance over the masked positions.

    Args:
        x: values, e.g. advantages ``(B, T)``.
        mask: bool, same shape as ``x``.
        keep_mean: add the masked mean back after scaling (only the spread is normalised).
        eps: added to the variance before the square root, guarding against zero variance.
        reduce_sum: sums over the processes (:data:`Reducer`): the mean and variance are then
            those of every process's masked values (:func:`masked_mean_var`); None = ``x``'s.

    Returns:
        Tensor shaped like ``x``; positions where ``mask`` is False hold 0.

    Raises:
        ValueError: fewer than 2 masked elements (see :func:`masked_mean_var`).
    """
    mean, var = masked_mean_var(x, mask, unbiased=True, reduce_sum=reduce_sum)  # () x2
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

"""Generalized Advantage Estimation (Schulman et al. 2016) over masked token sequences."""

from __future__ import annotations

import torch

__all__ = ["gae"]


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages and returns, walking each row backwards over its valid positions only.

    ``delta_t = r_t + gamma * V_next - V_t`` and ``A_t = delta_t + gamma * lam * A_next``, where
    "next" is the next position where ``mask`` is True. The value after the last valid position
    is 0 (the episode ends there). Masked-out positions (a left prompt offset, padding after the
    end, or gaps) are skipped: they contribute nothing, and whatever they hold (even garbage)
    never reaches a valid position. Advantages are not whitened here. Wrap the call in
    ``torch.no_grad()`` if no gradient is wanted (the function itself does not decide).

    Args:
        rewards: ``(B, T)`` per-token rewards.
        values: ``(B, T)`` value predictions at the same positions.
        mask: bool ``(B, T)``, True where a position is part of the episode.
        gamma: discount factor.
        lam: GAE lambda (bias / variance trade-off).

    Returns:
        ``(advantages, returns)``, both ``(B, T)``; ``returns = advantages + values`` on valid
        positions; both are 0 where ``mask`` is False.
    """
    batch, length = rewards.shape
    zero = torch.zeros((), dtype=values.dtype, device=values.device)  # ()
    next_value = torch.zeros(batch, dtype=values.dtype, device=values.device)  # (B,)
    next_advantage = torch.zeros(batch, dtype=values.dtype, device=values.device)  # (B,)
    advantages_reversed = []
    for t in reversed(range(length)):
        valid = mask[:, t]  # (B,)
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # (B,)
        advantage = delta + gamma * lam * next_advantage  # (B,)
        advantages_reversed.append(torch.where(valid, advantage, zero))  # (B,)
        # Carry "next" only through valid positions, so padding and prompt leave it untouched.
        next_value = torch.where(valid, values[:, t], next_value)  # (B,)
        next_advantage = torch.where(valid, advantage, next_advantage)  # (B,)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)  # (B, T)
    returns = torch.where(mask, advantages + values, zero)  # (B, T)
    return advantages, returns

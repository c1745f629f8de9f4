"""Advantage estimators over masked token sequences: GAE (Schulman et al. 2016) and the
critic-free GRPO, Dr. GRPO, RLOO and REINFORCE++.

One shape contract for every estimator, the same as :func:`rlhf_lit.functional.gae`:
``(scores (B,) or rewards (B, T), mask (B, T), ...) -> (advantages (B, T), returns (B, T))``,
both outputs 0 wherever ``mask`` is False.

**Groups.** The group estimators (GRPO, Dr. GRPO, RLOO) take ``k`` responses per prompt laid out
as *consecutive* rows: rows ``[g*k : (g+1)*k]`` are the k samples of prompt ``g`` (the layout of
``prompts.repeat_interleave(k, dim=0)``, which is also TRL's). ``B % k == 0`` is required and a
group must be whole in the batch given: normalising over a group split across ranks or minibatches
is a silent bug, so the caller keeps groups together and this module refuses a ragged batch.

**What "returns" means without a critic.** There is no value function to regress, so for the
group estimators ``returns`` equals ``advantages`` (as in verl's GRPO / RLOO and OpenRLHF's group
estimators); for REINFORCE++ it is the un-whitened discounted return-to-go. They are returned so
that every estimator fits the slot GAE fills, and for logging.

These functions do not decide about gradients: wrap the call in ``torch.no_grad()`` as the PPO
step does for GAE.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

from rlhf_lit.functional.masked_stats import Reducer, masked_whiten

EstimatorKind = Literal["gae", "grpo", "dr_grpo", "rloo", "reinforce_pp"]
"""The advantage estimator, one typed choice:

- ``gae``: critic + GAE (Schulman et al. 2016), the InstructGPT path (:func:`gae`).
- ``grpo``: group-normalised scores (Shao et al. 2024), :func:`grpo_advantages`.
- ``dr_grpo``: GRPO without the std division (Liu et al. 2025), ``scale_by_std=False``.
- ``rloo``: leave-one-out group baseline (Ahmadian et al. 2024), :func:`rloo_advantages`.
- ``reinforce_pp``: REINFORCE++ (Hu 2025), returns-to-go whitened over the batch,
  :func:`reinforce_pp_advantages`.
"""

_CRITIC = frozenset({"gae"})
_GROUPED = frozenset({"grpo", "dr_grpo", "rloo"})


def _check_kind(kind: str) -> None:
    if kind not in get_args(EstimatorKind):
        raise ValueError(f"Unknown advantage estimator {kind!r}; choose one of {get_args(EstimatorKind)}.")


def needs_critic(kind: EstimatorKind) -> bool:
    """Whether ``kind`` needs a value model (critic). Only ``gae`` does; the others build none."""
    _check_kind(kind)
    return kind in _CRITIC


def needs_groups(kind: EstimatorKind) -> bool:
    """Whether ``kind`` needs k > 1 samples per prompt in consecutive rows (grpo, dr_grpo, rloo).

    ``reinforce_pp`` normalises over the whole batch and needs no groups; ``gae`` neither.
    """
    _check_kind(kind)
    return kind in _GROUPED


def _grouped_scores(scores: torch.Tensor, mask: torch.Tensor, k: int, name: str) -> torch.Tensor:
    """``scores`` reshaped to ``(G, k)`` after checking the shape contract (shapes only, no sync)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        # One sample is its own baseline: every advantage would be 0 (and the unbiased std NaN).
        raise ValueError(f"{name}: k (samples per prompt) must be an int >= 2, got {k!r}.")
    if scores.ndim != 1:
        raise ValueError(f"{name}: scores must be (B,), got shape {tuple(scores.shape)}.")
    if mask.ndim != 2 or mask.shape[0] != scores.shape[0]:
        raise ValueError(
            f"{name}: mask must be (B, T) with B = len(scores) = {scores.shape[0]}, got shape {tuple(mask.shape)}."
        )
    if mask.dtype != torch.bool:
        raise ValueError(f"{name}: mask must be a bool tensor (True where a position counts), got {mask.dtype}.")
    if scores.shape[0] % k != 0:
        raise ValueError(
            f"{name}: batch size {scores.shape[0]} is not a multiple of k={k}; the k samples of a "
            "prompt must be consecutive rows and every group whole in the batch."
        )
    return scores.view(-1, k)  # (G, k)


def _broadcast_to_tokens(
    sequence_advantages: torch.Tensor, grouped: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero groups without spread, put each row's advantage on its valid tokens; ``(adv, returns)``."""
    zero = torch.zeros((), dtype=sequence_advantages.dtype, device=sequence_advantages.device)  # ()
    # A group whose scores are all equal carries no signal: its advantages are exactly 0. Computing
    # them would give rounding residue (mean of [0.1]*3 != 0.1 in float32) divided by std + eps.
    flat = (grouped.amax(dim=1) == grouped.amin(dim=1)).unsqueeze(-1)  # (G, 1)
    per_row = torch.where(flat, zero, sequence_advantages).reshape(-1)  # (B,)
    advantages = torch.where(mask, per_row.unsqueeze(-1), zero)  # (B, T)
    return advantages, advantages.clone()  # (B, T), (B, T)


def grpo_advantages(
    scores: torch.Tensor, mask: torch.Tensor, k: int, scale_by_std: bool = True, eps: float = 1e-4
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantages: ``(score - group mean) / (group std + eps)`` on every valid token.

    Shao et al. 2024 (DeepSeekMath, sec. 4.1.2, outcome supervision): each response's advantage is its
    score normalised within the group of k responses to the same prompt. ``scale_by_std=False`` is
    Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-like training"): the std division biases the
    update toward groups with small spread (too easy or too hard prompts), so it is dropped.

    The std is the **unbiased** sample std (Bessel's correction, ``torch.std``'s default), and
    ``eps = 1e-4``: both as TRL's ``GRPOTrainer``
    (``rewards.view(-1, k).std(dim=1)``, ``/ (std + 1e-4)``) and verl's GRPO (``torch.std``), so
    the numbers agree with theirs. The paper says only "std"; for k = 3 the unbiased std is
    ``sqrt(3/2)`` times the population std, so the choice changes the advantage scale by that factor.

    A group whose scores are all equal gets advantage 0 (never NaN): nothing to prefer in it.

    Args:
        scores: ``(B,)`` one scalar score per response (reward model, reward function, or both).
        mask: bool ``(B, T)``, True on the response tokens the advantage applies to.
        k: samples per prompt (>= 2); rows ``[g*k:(g+1)*k]`` are one prompt's group.
        scale_by_std: divide by the group std (GRPO); False is Dr. GRPO.
        eps: added to the std (not the variance) before dividing.

    Returns:
        ``(advantages, returns)``, both ``(B, T)``, equal to each other, 0 where ``mask`` is False.

    Raises:
        ValueError: bad shapes, a non-bool mask, ``k < 2`` or ``B % k != 0``.
    """
    grouped = _grouped_scores(scores, mask, k, "grpo_advantages")  # (G, k)
    centered = grouped - grouped.mean(dim=1, keepdim=True)  # (G, k)
    if scale_by_std:
        std = grouped.std(dim=1, keepdim=True, correction=1)  # (G, 1) unbiased, as TRL / verl
        centered = centered / (std + eps)  # (G, k)
    return _broadcast_to_tokens(centered, grouped, mask)


def rloo_advantages(scores: torch.Tensor, mask: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO advantages: each score minus the mean of the *other* k - 1 scores of its group.

    Ahmadian et al. 2024 ("Back to Basics: Revisiting REINFORCE Style Optimization"):
    ``A_i = r_i - 1/(k-1) * sum_{j != i} r_j``; the baseline does not depend on the sample it
    judges, so the estimate stays unbiased (equivalently ``k/(k-1) * (r_i - mean)``). Not
    normalised by any std. The KL to the reference, if any, belongs in the score (the paper puts
    it in the sequence reward) before this call.

    Args:
        scores: ``(B,)`` one scalar score per response.
        mask: bool ``(B, T)``, True on the response tokens the advantage applies to.
        k: samples per prompt (>= 2: a baseline needs another sample).

    Returns:
        ``(advantages, returns)``, both ``(B, T)``, equal to each other, 0 where ``mask`` is False.

    Raises:
        ValueError: bad shapes, a non-bool mask, ``k < 2`` or ``B % k != 0``.
    """
    grouped = _grouped_scores(scores, mask, k, "rloo_advantages")  # (G, k)
    leave_one_out = (grouped.sum(dim=1, keepdim=True) - grouped) / (k - 1)  # (G, k)
    return _broadcast_to_tokens(grouped - leave_one_out, grouped, mask)


def reinforce_pp_advantages(
    rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, reduce_sum: Reducer | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025): discounted returns-to-go per token, whitened over the whole batch.

    ``G_t = r_t + gamma * G_next`` walking each row backwards over its valid positions (as
    :func:`gae` does: masked positions are skipped, whatever they hold never reaches a valid one,
    and the return after the last valid token is 0). The advantages are the returns whitened
    (mean 0, unit unbiased variance) over every valid token of the batch with
    :func:`masked_whiten`; no critic, no group. The per-token ``rewards`` already carry the KL
    penalty and the score at the last response token (:func:`kl_penalized_rewards`): REINFORCE++
    keeps the KL in the reward. For "REINFORCE++-baseline", subtract the group mean from the
    scores before placing them.

    Global normalisation means over the *whole* batch: under data parallelism the statistics
    are those of all ranks when ``reduce_sum`` sums over them (the paper's global batch), else
    each rank whitens by its own.

    Args:
        rewards: ``(B, T)`` per-token rewards (KL penalty + score at the last valid token).
        mask: bool ``(B, T)``, True where a position is part of the response.
        gamma: discount (REINFORCE++ uses 1).
        reduce_sum: sums over the processes (:data:`~rlhf_lit.functional.masked_stats.Reducer`);
            None = whiten over this batch only.

    Returns:
        ``(advantages, returns)``, both ``(B, T)``, 0 where ``mask`` is False; ``returns`` are the
        un-whitened returns-to-go. If every valid return is equal the advantages are (near) 0.

    Raises:
        ValueError: shapes differ, a non-bool mask, or fewer than 2 valid tokens in the batch
            (over every process with ``reduce_sum``; the variance is undefined, see
            :func:`~rlhf_lit.functional.masked_stats.masked_mean_var`).
    """
    if rewards.ndim != 2 or rewards.shape != mask.shape:
        raise ValueError(
            f"reinforce_pp_advantages: rewards and mask must both be (B, T), got "
            f"{tuple(rewards.shape)} and {tuple(mask.shape)}."
        )
    if mask.dtype != torch.bool:
        raise ValueError(f"reinforce_pp_advantages: mask must be a bool tensor, got {mask.dtype}.")
    # Returns-to-go are GAE's advantages with zero values and lambda 1: delta_t = r_t, A_t = r_t + gamma * A_next.
    returns, _ = gae(rewards, torch.zeros_like(rewards), mask, gamma, lam=1.0)  # (B, T)
    advantages = masked_whiten(returns, mask, reduce_sum=reduce_sum)  # (B, T), 0 where mask is False
    return advantages, returns


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

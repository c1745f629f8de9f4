"""The PPO policy loss: one signature, one typed choice, a mapping from one to the other.

Every policy loss is a function of one signature (:data:`PolicyLoss`)::

    fn(logprobs, old_logprobs, advantages, mask, clip_range) -> (loss, stats)

``logprobs`` ``(B, T)`` the current policy's log-probabilities (with gradient), ``old_logprobs`` and
``advantages`` ``(B, T)`` from the rollout, ``mask`` bool ``(B, T)`` True on response tokens,
``clip_range`` PPO's epsilon (``ppo.clip_range``). ``loss`` is a 0-dim tensor that positions off
``mask`` do not change; ``stats`` maps at least ``clipfrac``, ``approx_kl`` and ``ratio_mean`` to
detached 0-dim tensors (PPO logs them as ``policy/clipfrac``, ``policy/approxkl``,
``policy/ratio``). No host syncs: the loss runs once per minibatch.

:data:`PolicyLossKind` names the variants and :data:`POLICY_LOSSES` maps each name to its function;
``ppo.policy_loss`` chooses one, and :func:`rlhf_lit.stages.ppo.loss.ppo_loss` is the one place the
choice is read. A variant (a sequence-level ratio, asymmetric clipping, another token aggregation)
is added in this file alone:

1. write its function, of the signature above;
2. add its name to :data:`PolicyLossKind` (``PPOConfig.policy_loss`` is typed by it: the option's
   check and ``--help`` follow);
3. add ``name: function`` to :data:`POLICY_LOSSES`.

``tests/functional/test_policy_losses.py`` holds every function to the signature's contract;
``tests/ppo/test_policy_loss_seam.py`` adds a variant by these steps and watches PPO's update call it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

from rlhf_lit.functional.losses import _check_clip_range
from rlhf_lit.functional.masked_stats import _masked_var, masked_mean

__all__ = ["POLICY_LOSSES", "PolicyLoss", "PolicyLossKind", "ppo_policy_loss"]

PolicyLossKind = Literal["clipped"]
"""The PPO policy loss, one typed choice (``ppo.policy_loss``):

- ``clipped``: the clipped surrogate (Schulman et al. 2017, eq. 7), a token mean: :func:`ppo_policy_loss`.
"""

PolicyLoss = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, dict[str, torch.Tensor]]
]
"""The one signature of a policy loss (see the module docstring)."""


def ppo_policy_loss(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, clip_range: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate loss (Schulman et al. 2017, eq. 7), averaged over masked tokens.

    Per token: ``max(-A * ratio, -A * clip(ratio, 1 - eps, 1 + eps))`` with
    ``ratio = exp(logprobs - old_logprobs)``; the max of the negated terms is the pessimistic
    (min) bound of the surrogate objective.

    Args:
        logprobs: ``(B, T)`` current policy log-probabilities (with grad).
        old_logprobs: ``(B, T)`` log-probabilities at rollout time.
        advantages: ``(B, T)`` (usually whitened) advantages.
        mask: bool ``(B, T)``, True on response tokens.
        clip_range: eps > 0.

    Returns:
        ``(loss, stats)``: loss a 0-dim tensor; stats maps ``clipfrac`` (fraction of masked tokens
        where the clipped term is strictly larger, i.e. active), ``approx_kl`` (mean of
        ``(ratio - 1) - log ratio``, the k3 estimator of KL(old || new)), ``ratio_mean`` and
        ``ratio_var`` (population variance) to detached 0-dim tensors. No host syncs.
    """
    _check_clip_range(clip_range)
    log_ratio = logprobs - old_logprobs  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T)
    loss_unclipped = -advantages * ratio  # (B, T)
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)  # (B, T)
    loss = masked_mean(torch.maximum(loss_unclipped, loss_clipped), mask)  # ()
    with torch.no_grad():
        stats = {
            "clipfrac": masked_mean((loss_clipped > loss_unclipped).to(ratio.dtype), mask),  # ()
            "approx_kl": masked_mean((ratio - 1) - log_ratio, mask),  # ()
            "ratio_mean": masked_mean(ratio, mask),  # ()
            "ratio_var": _masked_var(ratio, mask, unbiased=False),  # ()
        }
    return loss, stats


POLICY_LOSSES: dict[str, PolicyLoss] = {"clipped": ppo_policy_loss}
"""Each name of :data:`PolicyLossKind` and its function (the two hold the same names)."""

"""The PPO minibatch loss as a function of the minibatch, the forward pass and the settings."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlhf_lit.functional import (
    POLICY_LOSSES,
    clipped_value_loss,
    entropy_from_logits,
    entropy_of,
    kl_loss,
    log_distributions,
    masked_mean,
    token_logprobs,
)
from rlhf_lit.stages.ppo.config import KLConfig, PPOConfig
from rlhf_lit.stages.ppo.rollout import Rollout


@dataclass
class LossStats:
    """The statistics of a minibatch's loss (:func:`ppo_loss`, plus ``loss/ptx`` in
    :meth:`~rlhf_lit.stages.ppo.module.PPOModule.minibatch_loss`), or of an update
    (:func:`~rlhf_lit.stages.ppo.update.train_on_rollout`: ``logged`` averaged over its minibatches).

    Attributes:
        logged: detached ``()`` tensors named as they are logged (``loss/policy``, ``policy/clipfrac``, ...).
        old_logprob_diff: ``()`` token mean of ``|logprobs - old_logprobs|``; not logged as such: the
            update keeps it only before its first optimizer step, where it measures the old logprobs
            against the training pass (``policy/logprob_gen_train_diff``).
    """

    logged: dict[str, torch.Tensor]
    old_logprob_diff: torch.Tensor


def ppo_loss(
    mb: Rollout,
    logits: torch.Tensor,
    values: torch.Tensor | None,
    ppo: PPOConfig,
    temperature: float,
    kl: KLConfig,
    kl_coef: float,
    ref_distributions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """Policy loss + vf_coef * clipped value loss - entropy_coef * entropy (+ kl_coef * KL with
    ``kl.mode: loss``): the last three token means over the minibatch's response tokens, the policy
    loss aggregated as its variant says (``clipped``: a token mean too). The one place
    ``ppo.policy_loss`` is read: it names the function in
    :data:`~rlhf_lit.functional.policy_losses.POLICY_LOSSES`.

    Args:
        mb: the minibatch (old logprobs, values, advantages, returns, reference logprobs, mask).
        logits: ``(B, R, V)`` the policy's response logits now (with gradient).
        values: ``(B, R)`` the critic's values now; None without a critic (no value loss).
        ppo: the policy loss, clip ranges and coefficients.
        temperature: the sampling temperature the logits are divided by.
        kl: where the KL is paid and, with ``kl.mode: loss``, the estimator differentiated.
        kl_coef: beta of this rollout (the controller updates after the update).
        ref_distributions: ``(B, R, V)`` the reference's log-probabilities of every token at each
            response position (no grad); read by ``kl.loss_estimator: exact`` only, which needs them.

    Returns:
        ``(loss (), stats)``: the :class:`LossStats` of the minibatch.
    """
    mask = mb.response_mask  # (B, R)
    zero = torch.zeros((), device=mask.device)
    logprobs = token_logprobs(logits, mb.response_ids, temperature)  # (B, R)
    policy_loss_fn = POLICY_LOSSES[ppo.policy_loss]
    policy_loss, policy_stats = policy_loss_fn(logprobs, mb.old_logprobs, mb.advantages, mask, ppo.clip_range)
    value_loss, value_stats = zero, {"clipfrac": zero}
    if values is not None:
        value_loss, value_stats = clipped_value_loss(values, mb.old_values, mb.returns, mask, ppo.value_clip_range)
    # The exact KL term reads the whole distributions: computed once, the entropy's too.
    exact = kl.mode == "loss" and kl.loss_estimator == "exact"
    distributions = log_distributions(logits, temperature) if exact else None  # (B, R, V) or None
    # Keep the entropy graph only when it is trained on (a (B, R, V) graph is not free).
    if distributions is not None:
        token_entropy = entropy_of(distributions if ppo.entropy_coef > 0 else distributions.detach())  # (B, R)
    else:
        token_entropy = entropy_from_logits(logits if ppo.entropy_coef > 0 else logits.detach(), temperature)  # (B, R)
    entropy = masked_mean(token_entropy, mask)  # ()
    loss = policy_loss + ppo.vf_coef * value_loss - ppo.entropy_coef * entropy  # ()
    stats = {
        "loss/policy": policy_loss.detach(),
        "loss/value": value_loss.detach(),
        "policy/entropy": entropy.detach(),
        "policy/clipfrac": policy_stats["clipfrac"],
        "policy/approxkl": policy_stats["approx_kl"],
        "policy/ratio": policy_stats["ratio_mean"],
        "value/clipfrac": value_stats["clipfrac"],
    }
    old_logprob_diff = masked_mean((logprobs.detach() - mb.old_logprobs).abs(), mask)  # ()
    if kl.mode == "loss":
        # The rollout's old logprobs are the sampling policy's: k3_weighted's weight pi / pi_old.
        both = None if distributions is None or ref_distributions is None else (distributions, ref_distributions)
        kl_term = kl_loss(
            logprobs, mb.ref_logprobs, mask, kl.loss_estimator, old_logprobs=mb.old_logprobs, distributions=both
        )  # ()
        loss = loss + kl_coef * kl_term  # ()
        stats["loss/kl"] = kl_term.detach()
    return loss, LossStats(stats, old_logprob_diff)

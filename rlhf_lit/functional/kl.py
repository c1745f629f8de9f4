"""Per-token KL estimators, KL-shaped rewards (the InstructGPT reward) and the KL as a loss term."""

from __future__ import annotations

from typing import Literal, get_args

import torch

from rlhf_lit.functional.masked_stats import masked_mean
from rlhf_lit.functional.masks import last_true_index

KLKind = Literal["k1", "k2", "k3", "abs"]
"""Per-token KL estimators of KL(policy || reference) from samples of the policy
(John Schulman, "Approximating KL Divergence", 2020): k1 unbiased, k2 low variance but biased,
k3 unbiased, low variance and never negative; "abs" is |k1| as in TRL."""

KLMode = Literal["reward", "loss"]
"""Where PPO pays the KL: ``reward``, ``-beta`` times the per-token estimate in each token's reward
(:func:`kl_penalized_rewards`, the InstructGPT reward); ``loss``, ``beta`` times its token mean as a
loss term (:func:`kl_loss`, GRPO)."""


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: KLKind) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) at the sampled tokens.

    Args:
        logprobs: ``(B, T)`` policy log-probabilities of the sampled tokens.
        ref_logprobs: ``(B, T)`` reference log-probabilities of the same tokens.
        kind: "k1" = ``logprobs - ref_logprobs``; "k2" = ``0.5 * (logprobs - ref_logprobs)^2``;
            "k3" = ``(exp(r) - 1) - r`` with ``r = ref_logprobs - logprobs``;
            "abs" = ``|logprobs - ref_logprobs|``.

    Returns:
        ``(B, T)`` per-token KL estimates (no masking).
    """
    log_ratio = logprobs - ref_logprobs  # (B, T)
    if kind == "k1":
        return log_ratio  # (B, T)
    if kind == "k2":
        return 0.5 * log_ratio**2  # (B, T)
    if kind == "k3":
        r = -log_ratio  # (B, T) log(ref / policy)
        # expm1 keeps precision when r is near 0 (the usual case: policy close to reference).
        return torch.expm1(r) - r  # (B, T)
    if kind == "abs":
        return log_ratio.abs()  # (B, T)
    raise ValueError(f"Unknown KL estimator kind {kind!r}; choose one of {get_args(KLKind)}.")


def kl_penalized_rewards(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float | torch.Tensor,
    kind: KLKind = "k1",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards ``-kl_coef * kl`` plus the sequence score on the last counted token.

    This is the InstructGPT / Ziegler et al. (2019) reward: the reward model scores the whole
    response once, and the KL penalty to the frozen reference is paid at every token.

    Args:
        scores: ``(B,)`` one reward-model score per sequence.
        logprobs: ``(B, T)`` policy log-probabilities of the response tokens.
        ref_logprobs: ``(B, T)`` reference log-probabilities of the same tokens.
        mask: bool ``(B, T)``; True on response tokens (prompt and padding False; the mask may
            start late, e.g. with the prompt masked out).
        kl_coef: the KL coefficient (beta), a python float or a 0-dim tensor.
        kind: the KL estimator, see :func:`kl_penalty`.

    Returns:
        ``(rewards, kl)``, both ``(B, T)`` and 0 where ``mask`` is False. A row whose mask has no
        True gets no score anywhere (its rewards are all 0): there is no token to credit.
    """
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)  # ()
    kl = torch.where(mask, kl_penalty(logprobs, ref_logprobs, kind), zero)  # (B, T)
    rewards = -kl_coef * kl  # (B, T)
    last = last_true_index(mask)  # (B,) -1 for an empty row
    positions = torch.arange(mask.shape[-1], device=mask.device)  # (T,)
    # One-hot of the last counted token; an empty row's -1 matches no position, so no score.
    is_last = positions.unsqueeze(0) == last.unsqueeze(-1)  # (B, T)
    rewards = rewards + torch.where(is_last, scores.unsqueeze(-1).to(rewards.dtype), zero)  # (B, T)
    return torch.where(mask, rewards, zero), kl  # (B, T), (B, T)


KLLossKind = Literal["k3_weighted", "k2", "k3", "exact"]
"""The estimator :func:`kl_loss` differentiates, for tokens sampled from ``pi_old`` and the current
policy ``pi`` (per token; ``r = log pi - log pi_ref``):

- ``k3_weighted``: ``(pi / pi_old) * k3``, the weight with its gradient. Its expectation under
  ``pi_old`` is KL(pi || pi_ref) at every ``pi``, so its gradient is the reverse KL's, on-policy and
  off-policy (the minibatches after the first optimizer step); per sample it is ``(pi / pi_old) * r *
  grad log pi``. The default.
- ``k2``: ``r^2 / 2``, gradient ``r * grad log pi``: the reverse KL's in expectation when ``pi_old =
  pi`` (on-policy) only.
- ``k3``: GRPO's (Shao et al. 2024), gradient ``(1 - pi_ref / pi) * grad log pi``, whose expectation
  on-policy is the gradient of the forward KL(pi_ref || pi): a first-order stand-in for the reverse
  KL's, biased wherever the policy is not close to the reference.
- ``exact``: no estimate over the next token: at each visited prefix the KL of the two next-token
  distributions summed over the whole vocabulary, ``sum_v pi(v) (log pi(v) - log pi_ref(v))``, and its
  exact gradient, from any sampler. It reads both full distributions (``(B, T, V)``: one more
  reference pass per minibatch), and has none of the sampled estimators' noise: a drift of the whole
  distribution that costs KL at every token (a sharpening, say) is pulled back at every token.

In a response every token's term is taken at the state (prefix) the sampled tokens reached, so the
gradient is that of the per-token KLs at the visited prefixes; how earlier tokens change which
prefixes are reached is not differentiated (a KL paid in the reward, :func:`kl_penalized_rewards`,
reaches it through the returns)."""


def kl_loss(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    kind: KLLossKind = "k3_weighted",
    old_logprobs: torch.Tensor | None = None,
    distributions: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """KL(policy || reference) as a loss term (GRPO style), the mean over masked tokens.

    GRPO (Shao et al. 2024) adds ``beta * KL`` to the loss instead of paying it in the reward. What
    is differentiated is ``kind`` (:data:`KLLossKind`); the default, ``k3_weighted``, has the
    reverse KL's gradient whichever policy sampled the tokens. The mean is over every masked token of
    the batch, the token-level average :func:`ppo_policy_loss` uses (DAPO), not a mean of
    per-response means. The caller multiplies by the KL coefficient.

    Args:
        logprobs: ``(B, T)`` current policy log-probabilities (with grad).
        ref_logprobs: ``(B, T)`` reference log-probabilities of the same tokens (no grad).
        mask: bool ``(B, T)``, True on response tokens.
        kind: the estimator, see :data:`KLLossKind`; "k3" is GRPO's.
        old_logprobs: ``(B, T)`` log-probabilities of the tokens under the policy that sampled them
            (no grad), the denominator of ``k3_weighted``'s weight; None: the current policy sampled
            them (on-policy: the weight is 1, with the gradient of ``log pi``). Only ``k3_weighted``
            reads it.
        distributions: ``exact`` only, which needs them: ``(B, T, V)`` log-probabilities of every
            token of the vocabulary under the current policy (with grad) and under the reference (no
            grad), at the positions of ``logprobs``.

    Returns:
        0-dim tensor; NaN when the mask is empty (no host check, as :func:`masked_mean`). With
        ``k3_weighted`` its expectation is KL(policy || reference) per token.
    """
    if kind not in get_args(KLLossKind):
        raise ValueError(f"Unknown KL loss estimator {kind!r}; choose one of {', '.join(get_args(KLLossKind))}.")
    if kind == "exact":
        if distributions is None:
            raise ValueError(
                "kl_loss(kind='exact') needs distributions: the policy's and the reference's (B, T, V) log-probabilities"
            )
        return masked_mean(exact_kl(*distributions), mask)  # ()
    if kind != "k3_weighted":
        return masked_mean(kl_penalty(logprobs, ref_logprobs, kind), mask)  # ()
    old = logprobs.detach() if old_logprobs is None else old_logprobs  # (B, T)
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    # The log-weight is 0 off the mask before exp: padding's garbage must not reach exp's gradient.
    log_weight = torch.where(mask, logprobs - old, zero)  # (B, T) log(pi / pi_old)
    return masked_mean(torch.exp(log_weight) * kl_penalty(logprobs, ref_logprobs, "k3"), mask)  # ()


def exact_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """``(B, T)`` KL(policy || reference) of each position's next-token distributions, summed over the vocabulary.

    Args:
        log_probs: ``(B, T, V)`` the policy's log-probabilities (normalised over ``V``).
        ref_log_probs: ``(B, T, V)`` the reference's.

    Returns:
        ``(B, T)``: ``sum_v exp(log_probs) * (log_probs - ref_log_probs)``, >= 0 up to rounding; a token the
        policy gives probability 0 (a ``-inf`` log-probability, on both sides or not) adds 0, value and gradient.
    """
    possible = log_probs > float("-inf")  # (B, T, V)
    zero = torch.zeros((), dtype=log_probs.dtype, device=log_probs.device)
    # -inf - -inf is NaN, and 0 * NaN too, in the backward pass as well: the impossible tokens' logs are
    # replaced before the arithmetic, not masked after it.
    log_p = torch.where(possible, log_probs, zero)  # (B, T, V)
    log_q = torch.where(possible, ref_log_probs, zero)  # (B, T, V)
    return torch.where(possible, log_p.exp() * (log_p - log_q), zero).sum(-1)  # (B, T)

"""A tabular policy on which a KL loss term's EXPECTED gradient is computed exactly, with the exact
gradient of KL(pi || pi_ref) to hold it to (tests/functional/test_kl_loss_gradient.py,
tests/ppo/test_kl_loss_term.py).

The policy is one step over ``A`` actions (a bandit), ``pi = softmax(theta)``. The tokens a loss sees
are drawn from a sampler ``pi_old``: the policy itself (on-policy, the first minibatch of an update) or
another one (off-policy, the minibatches after an optimizer step). The expected gradient is the sum
over every action of ``pi_old(a) * d loss(a) / d theta``: an enumeration, not Monte Carlo, so the
comparison holds to float64 rounding and a biased estimator is off by far more than that.

The exact gradient is written from the closed form by hand (:func:`reverse_kl_gradient`), and checked
against autograd on the closed-form sum (:func:`closed_form_kl`) in the functional test.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

LOGITS = torch.tensor([0.9, -0.4, 0.3, -1.2], dtype=torch.float64)
"""theta, the policy's logits; pi = softmax(theta) = 0.487, 0.133, 0.267, 0.060 (3 digits)."""

SAMPLER_LOGITS = torch.tensor([0.2, 0.5, -0.7, 0.1], dtype=torch.float64)
"""The logits of an off-policy sampler pi_old, far from pi (and from the reference)."""

REF_PROBS = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
"""pi_ref: far from pi, so that an estimator's bias shows at ~0.1, not in the rounding."""

REF_LOGPROBS = REF_PROBS.log()
ACTIONS = len(LOGITS)

ActionLoss = Callable[[torch.Tensor, int], torch.Tensor]
"""``loss(theta, a)``: the loss of one sampled action ``a`` under the policy of logits ``theta``
(``(A,)``, with the gradient)."""


def closed_form_kl(logits: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """KL(pi || pi_ref) = sum_a pi_a (log pi_a - log pi_ref_a), ``pi = softmax(logits)``, summed over
    every action (no sampling): differentiable in ``logits``."""
    logprobs = torch.log_softmax(logits, dim=-1)
    return (logprobs.exp() * (logprobs - ref_logprobs)).sum(-1)


def reverse_kl_gradient(logits: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """d KL(pi || pi_ref) / d theta_j = pi_j * (r_j - KL), ``r = log pi - log pi_ref``.

    By hand: d pi_a / d theta_j = pi_a (delta_aj - pi_j), so
    d/d theta_j sum_a pi_a r_a = sum_a pi_a (delta_aj - pi_j) r_a + sum_a pi_a (delta_aj - pi_j)
    = pi_j r_j - pi_j KL + (pi_j - pi_j) = pi_j (r_j - KL).
    """
    logprobs = torch.log_softmax(logits, dim=-1)
    pi = logprobs.exp()
    r = logprobs - ref_logprobs
    return pi * (r - (pi * r).sum())


def forward_kl_gradient(logits: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """d KL(pi_ref || pi) / d theta_j = pi_j - pi_ref_j.

    By hand: KL(pi_ref || pi) = sum_a pi_ref_a (log pi_ref_a - log pi_a) and d log pi_a / d theta_j =
    delta_aj - pi_j, so the derivative is -sum_a pi_ref_a (delta_aj - pi_j) = pi_j - pi_ref_j.
    """
    return torch.softmax(logits, dim=-1) - ref_logprobs.exp()


def expected_gradient(loss: ActionLoss, logits: torch.Tensor, sampler_logprobs: torch.Tensor) -> torch.Tensor:
    """``sum_a pi_old(a) * d loss(a) / d theta`` at ``theta = logits``: the gradient a loss term
    has in expectation over tokens drawn from ``pi_old`` (``exp(sampler_logprobs)``)."""
    theta = logits.clone().requires_grad_(True)
    total = sum(sampler_logprobs[a].exp() * loss(theta, a) for a in range(len(logits)))
    (gradient,) = torch.autograd.grad(total, theta)
    return gradient

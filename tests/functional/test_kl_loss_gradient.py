"""The KL loss term's expected gradient on a tabular policy, against the exact gradient of
KL(pi || pi_ref) (tests/tabular_kl.py: every action enumerated, weighted by the sampler's
probabilities, so the comparison is exact up to float64 rounding).

What each estimator of :data:`~rlhf_lit.functional.kl.KLLossKind` gives, by the derivation in its
docstring: ``k3_weighted`` the reverse KL's gradient from any sampler; ``k2`` the reverse KL's from the
policy itself only; ``k3`` the forward KL(pi_ref || pi)'s. The default must be one whose gradient is
the reverse KL's on every minibatch: plain ``k3`` as the default fails here.
"""

import inspect

import pytest
import torch
from tabular_kl import (
    LOGITS,
    REF_LOGPROBS,
    SAMPLER_LOGITS,
    closed_form_kl,
    expected_gradient,
    forward_kl_gradient,
    reverse_kl_gradient,
)
from torch.testing import assert_close

from rlhf_lit.functional import kl_loss

torch.set_num_threads(1)

ONE = torch.ones(1, 1, dtype=torch.bool)
ON_POLICY = torch.log_softmax(LOGITS, dim=-1)  # pi_old = pi (values; no gradient)
OFF_POLICY = torch.log_softmax(SAMPLER_LOGITS, dim=-1)
SAMPLERS = {"on-policy": ON_POLICY, "off-policy": OFF_POLICY}
EXACT = reverse_kl_gradient(LOGITS, REF_LOGPROBS)


def kl_loss_of(kind, sampler_logprobs):
    """The loss of one sampled action as PPO computes it: a one-token response, the sampler's logprob
    as the old logprob."""

    def loss(theta, a):
        logprob = torch.log_softmax(theta, dim=-1)[a]
        old = sampler_logprobs[a].view(1, 1)
        if kind is None:  # the function's default estimator
            return kl_loss(logprob.view(1, 1), REF_LOGPROBS[a].view(1, 1), ONE, old_logprobs=old)
        return kl_loss(logprob.view(1, 1), REF_LOGPROBS[a].view(1, 1), ONE, kind, old_logprobs=old)

    return loss


def test_the_hand_derived_gradient_is_autograd_of_the_closed_form():
    theta = LOGITS.clone().requires_grad_(True)
    closed_form_kl(theta, REF_LOGPROBS).backward()
    assert_close(EXACT, theta.grad)
    # The reference is far from the policy: a biased estimator is off by far more than rounding.
    assert float((EXACT - forward_kl_gradient(LOGITS, REF_LOGPROBS)).abs().max()) > 0.1


@pytest.mark.parametrize(
    ("kind", "sampler", "unbiased"),
    [
        ("k3_weighted", "on-policy", True),
        ("k3_weighted", "off-policy", True),
        ("k2", "on-policy", True),
        ("k2", "off-policy", False),  # r * grad log pi weighted by pi_old, not pi
        ("k3", "on-policy", False),  # the forward KL's gradient, below
        ("k3", "off-policy", False),
    ],
)
def test_which_estimators_have_the_reverse_kl_gradient(kind, sampler, unbiased):
    gradient = expected_gradient(kl_loss_of(kind, SAMPLERS[sampler]), LOGITS, SAMPLERS[sampler])
    if unbiased:
        assert_close(gradient, EXACT)
    else:
        assert float((gradient - EXACT).abs().max()) > 0.1, gradient


def test_plain_k3_on_policy_has_the_forward_kl_gradient():
    # E_pi[(1 - pi_ref / pi) grad log pi] = pi - pi_ref = d KL(pi_ref || pi) / d theta.
    gradient = expected_gradient(kl_loss_of("k3", ON_POLICY), LOGITS, ON_POLICY)
    assert_close(gradient, forward_kl_gradient(LOGITS, REF_LOGPROBS))


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_the_default_estimator_has_the_reverse_kl_gradient(sampler):
    """The done-when of the KL loss: make plain ``k3`` (or unweighted ``k2``) the default and this fails."""
    gradient = expected_gradient(kl_loss_of(None, SAMPLERS[sampler]), LOGITS, SAMPLERS[sampler])
    assert_close(gradient, EXACT)


def test_without_old_logprobs_the_tokens_are_the_current_policys():
    gradient = expected_gradient(
        lambda theta, a: kl_loss(torch.log_softmax(theta, -1)[a].view(1, 1), REF_LOGPROBS[a].view(1, 1), ONE),
        LOGITS,
        ON_POLICY,
    )
    assert_close(gradient, EXACT)
    assert inspect.signature(kl_loss).parameters["old_logprobs"].default is None


def test_k3_weighted_is_an_unbiased_estimate_of_the_kl_itself_from_any_sampler():
    # E_old[(pi / pi_old) k3] = sum_a (pi_ref_a - pi_a) + sum_a pi_a r_a = KL(pi || pi_ref): the logged
    # loss/kl is the KL of the current policy, not of the sampler.
    for sampler in SAMPLERS.values():
        value = sum(sampler[a].exp() * kl_loss_of("k3_weighted", sampler)(LOGITS, a) for a in range(4))
        assert_close(value, closed_form_kl(LOGITS, REF_LOGPROBS))


# --- two steps: what a per-token loss is the gradient of in a response --------------------------

A2 = 3
THETA1 = torch.tensor([0.6, -0.8, 0.1], dtype=torch.float64)  # pi(a1)
THETA2 = torch.tensor([[1.0, -0.5, 0.0], [-1.1, 0.4, 0.9], [0.2, 0.2, -1.3]], dtype=torch.float64)  # pi(a2 | a1)
REF1 = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64).log()
REF2 = torch.tensor([[0.6, 0.2, 0.2], [0.1, 0.3, 0.6], [0.3, 0.4, 0.3]], dtype=torch.float64).log()
SAMPLER1 = torch.log_softmax(torch.tensor([-0.3, 0.7, 0.2], dtype=torch.float64), dim=-1)
SAMPLER2 = torch.log_softmax(
    torch.tensor([[0.0, 0.9, -0.4], [0.5, -0.2, 0.1], [-0.6, 0.3, 0.8]], dtype=torch.float64), -1
)


def two_step_expected_gradient(sampler1, sampler2):
    """sum over the A2 x A2 responses (a1, a2) of pi_old(a1, a2) * d [2 * kl_loss(response)] / d theta
    (kl_loss is the mean over the 2 tokens; times 2, the response's sum), with the default estimator."""
    theta1, theta2 = THETA1.clone().requires_grad_(True), THETA2.clone().requires_grad_(True)
    lp1, lp2 = torch.log_softmax(theta1, -1), torch.log_softmax(theta2, -1)
    total = 0.0
    for a1 in range(A2):
        for a2 in range(A2):
            logprobs = torch.stack([lp1[a1], lp2[a1, a2]]).view(1, 2)
            ref = torch.stack([REF1[a1], REF2[a1, a2]]).view(1, 2)
            old = torch.stack([sampler1[a1], sampler2[a1, a2]]).view(1, 2)
            weight = (sampler1[a1] + sampler2[a1, a2]).exp()
            total = total + weight * 2 * kl_loss(logprobs, ref, torch.ones(1, 2, dtype=torch.bool), old_logprobs=old)
    return torch.autograd.grad(total, (theta1, theta2))


def per_prefix_kl_gradient(sampler1):
    """Autograd of KL(pi1 || ref1) + sum_a1 pi_old(a1) KL(pi2(. | a1) || ref2(. | a1)): each token's KL
    at the prefixes the sampler reaches, their probabilities held fixed."""
    theta1, theta2 = THETA1.clone().requires_grad_(True), THETA2.clone().requires_grad_(True)
    objective = closed_form_kl(theta1, REF1) + (sampler1.exp() * closed_form_kl(theta2, REF2)).sum()
    return torch.autograd.grad(objective, (theta1, theta2))


@pytest.mark.parametrize("on_policy", [True, False])
def test_per_token_the_default_has_the_gradient_of_each_tokens_kl_at_the_reached_prefixes(on_policy):
    sampler1 = torch.log_softmax(THETA1, -1) if on_policy else SAMPLER1
    sampler2 = torch.log_softmax(THETA2, -1) if on_policy else SAMPLER2
    for got, exact in zip(two_step_expected_gradient(sampler1, sampler2), per_prefix_kl_gradient(sampler1)):
        assert_close(got, exact)


def test_per_token_the_loss_leaves_out_how_the_first_token_moves_the_second_tokens_kl():
    """On-policy, against the whole response's KL(pi || pi_ref) = KL1 + sum_a1 pi(a1) KL2(a1): the
    second token's gradient is the same; the first token's lacks sum_a1 d pi(a1) / d theta1 * KL2(a1)
    (the docstring of KLLossKind says so; a KL paid in the reward carries it)."""
    on1, on2 = torch.log_softmax(THETA1, -1), torch.log_softmax(THETA2, -1)
    got1, got2 = two_step_expected_gradient(on1, on2)
    theta1, theta2 = THETA1.clone().requires_grad_(True), THETA2.clone().requires_grad_(True)
    sequence_kl = closed_form_kl(theta1, REF1) + (torch.softmax(theta1, -1) * closed_form_kl(theta2, REF2)).sum()
    exact1, exact2 = torch.autograd.grad(sequence_kl, (theta1, theta2))
    assert_close(got2, exact2)
    theta1 = THETA1.clone().requires_grad_(True)
    (missing,) = torch.autograd.grad((torch.softmax(theta1, -1) * closed_form_kl(THETA2, REF2)).sum(), theta1)
    assert float(missing.abs().max()) > 0.02
    assert_close(exact1 - got1, missing)

"""``kl.mode: loss`` in PPO's minibatch loss: with the default ``kl.loss_estimator`` its expected
gradient is beta times the exact gradient of KL(pi || pi_ref), on the first minibatch (on-policy) and on
those after an optimizer step (the rollout's old logprobs are another policy's), on the tabular policy
of tests/tabular_kl.py; GRPO's plain ``k3``, kept by name, is not. And the settings around it.

The minibatch is one response of one token, the action, with the policy's logits for it: advantages 0
and no entropy bonus, so the loss is ``kl_coef * loss/kl`` alone (the clipped surrogate of a zero
advantage has no gradient).
"""

import math

import pytest
import torch
from tabular_kl import LOGITS, REF_LOGPROBS, SAMPLER_LOGITS, expected_gradient, reverse_kl_gradient
from torch.testing import assert_close

from rlhf_lit.functional import exact_kl
from rlhf_lit.stages.ppo.config import KLConfig, PPOConfig
from rlhf_lit.stages.ppo.loss import ppo_loss
from rlhf_lit.stages.ppo.rollout import Rollout

torch.set_num_threads(1)

BETA = 0.3
SAMPLERS = {
    "first minibatch (on-policy)": torch.log_softmax(LOGITS, dim=-1),
    "after a step (off-policy)": torch.log_softmax(SAMPLER_LOGITS, dim=-1),
}


def one_token_minibatch(action: int, old_logprob: torch.Tensor) -> Rollout:
    """A rollout of one row: prompt token 0, the response the single token ``action``."""
    zero = torch.zeros(1, 1, dtype=torch.float64)
    return Rollout(
        query_responses=torch.tensor([[0, action]]),
        attention_mask=torch.ones(1, 2, dtype=torch.long),
        response_ids=torch.tensor([[action]]),
        response_mask=torch.ones(1, 1, dtype=torch.bool),
        ended=torch.ones(1, dtype=torch.bool),
        old_logprobs=old_logprob.view(1, 1),
        ref_logprobs=REF_LOGPROBS[action].view(1, 1),
        old_values=zero,
        raw_scores=torch.zeros(1, dtype=torch.float64),
        scores=torch.zeros(1, dtype=torch.float64),
        kl=zero,
        rewards=zero,
        advantages=zero,
        returns=zero,
    )


def ppo_loss_gradient(kl: KLConfig, sampler_logprobs: torch.Tensor) -> torch.Tensor:
    """The expected gradient of :func:`ppo_loss` over the actions drawn from ``sampler_logprobs``."""

    def loss(theta, action):
        mb = one_token_minibatch(action, sampler_logprobs[action])
        value, _ = ppo_loss(mb, theta.view(1, 1, -1), None, PPOConfig(), 1.0, kl, BETA)  # logits (1, 1, A)
        return value

    return expected_gradient(loss, LOGITS, sampler_logprobs)


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_the_default_kl_loss_has_beta_times_the_reverse_kl_gradient(sampler):
    """The done-when of ``kl.loss_estimator``: its default as ``k3`` (or ``k2``) fails here."""
    kl = KLConfig(kind="fixed", init_coef=BETA, mode="loss")
    gradient = ppo_loss_gradient(kl, SAMPLERS[sampler])
    assert_close(gradient, BETA * reverse_kl_gradient(LOGITS, REF_LOGPROBS))


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_grpos_k3_is_kept_by_name_and_is_biased(sampler):
    kl = KLConfig(kind="fixed", init_coef=BETA, mode="loss", estimator="k3", loss_estimator="k3")
    gradient = ppo_loss_gradient(kl, SAMPLERS[sampler])
    assert float((gradient - BETA * reverse_kl_gradient(LOGITS, REF_LOGPROBS)).abs().max()) > 0.03


def test_the_logged_kl_term_is_the_loss_estimators_value():
    # An off-policy row: loss/kl is (pi / pi_old) * k3 at the action, by the formulas.
    action, old = 1, torch.log_softmax(SAMPLER_LOGITS, dim=-1)[1]
    logprob = torch.log_softmax(LOGITS, dim=-1)[action]
    r = REF_LOGPROBS[action] - logprob
    expected = float(torch.exp(logprob - old) * (torch.exp(r) - 1 - r))
    kl = KLConfig(kind="fixed", init_coef=BETA, mode="loss")
    loss, stats = ppo_loss(one_token_minibatch(action, old), LOGITS.view(1, 1, -1), None, PPOConfig(), 1.0, kl, BETA)
    assert float(stats.logged["loss/kl"]) == pytest.approx(expected, rel=1e-12)
    assert float(loss) == pytest.approx(BETA * expected, rel=1e-12)


def test_the_loss_estimator_choices_and_where_they_apply():
    assert KLConfig(mode="loss").loss_estimator == "k3_weighted"
    assert KLConfig(mode="loss", estimator="k3", loss_estimator="k2").loss_estimator == "k2"
    with pytest.raises(ValueError, match="kl.loss_estimator must be one of k3_weighted, k2, k3, exact; got 'k1'"):
        KLConfig(mode="loss", loss_estimator="k1")
    # Reward mode pays kl.estimator; a loss estimator set there would do nothing.
    with pytest.raises(ValueError, match="kl.loss_estimator='k3' applies to kl.mode='loss'"):
        KLConfig(loss_estimator="k3")
    # In loss mode kl.estimator is only measured (objective/kl, the controller): a KL in nats.
    with pytest.raises(
        ValueError, match="kl.mode='loss' measures the KL with kl.estimator.*got 'k2'.*kl.loss_estimator"
    ):
        KLConfig(kind="fixed", mode="loss", estimator="k2")


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_the_exact_kl_loss_has_beta_times_the_reverse_kl_gradient_from_every_sample(sampler):
    """``exact`` reads the reference's whole distribution: every drawn action gives the same gradient,
    beta times the exact one (no expectation needed), whoever sampled it."""
    kl = KLConfig(kind="fixed", init_coef=BETA, mode="loss", loss_estimator="exact")
    ref_distributions = REF_LOGPROBS.view(1, 1, -1)
    exact = BETA * reverse_kl_gradient(LOGITS, REF_LOGPROBS)
    for action in range(LOGITS.shape[-1]):
        theta = LOGITS.clone().requires_grad_(True)
        mb = one_token_minibatch(action, SAMPLERS[sampler][action])
        loss, _ = ppo_loss(mb, theta.view(1, 1, -1), None, PPOConfig(), 1.0, kl, BETA, ref_distributions)
        loss.backward()
        assert_close(theta.grad, exact)


def test_the_exact_kl_term_is_the_closed_form_and_needs_the_reference_distributions():
    # Two tokens: pi = (3/4, 1/4), pi_ref = (1/2, 1/2): KL = 3/4 ln(3/2) + 1/4 ln(1/2), by hand.
    logits = torch.log(torch.tensor([0.75, 0.25], dtype=torch.float64)).view(1, 1, 2)
    ref = torch.log(torch.tensor([0.5, 0.5], dtype=torch.float64)).view(1, 1, 2)
    mb = Rollout(**{**one_token_minibatch(0, torch.tensor(0.0)).__dict__, "ref_logprobs": ref[:, :, 0]})
    kl = KLConfig(kind="fixed", init_coef=BETA, mode="loss", loss_estimator="exact")
    loss, stats = ppo_loss(mb, logits, None, PPOConfig(), 1.0, kl, BETA, ref)
    expected = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    assert float(stats.logged["loss/kl"]) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="kind='exact'.* needs distributions"):
        ppo_loss(mb, logits, None, PPOConfig(), 1.0, kl, BETA)


def test_the_exact_kl_of_a_vocabulary_with_impossible_tokens_is_finite_value_and_gradient():
    # The third token is impossible on both sides (a masked vocabulary slot): KL as over the first two.
    logits = torch.tensor([math.log(0.75), math.log(0.25), float("-inf")], dtype=torch.float64).requires_grad_(True)
    ref = torch.log(torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)).view(1, 1, 3)
    value = exact_kl(torch.log_softmax(logits, -1).view(1, 1, 3), ref)
    assert float(value.detach()) == pytest.approx(0.75 * math.log(1.5) + 0.25 * math.log(0.5), rel=1e-12)
    value.sum().backward()
    assert torch.isfinite(logits.grad).all()
    assert float(logits.grad[2]) == 0.0

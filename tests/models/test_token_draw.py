"""How a sampled token is drawn (``SamplingConfig.draw``): the inverse-CDF draw by hand, its frequencies through
``generate`` against the model's own distribution (an independent softmax / top-k / top-p), the logprobs
recorded beside it (its seeding: tests/models/test_generation.py)."""

from __future__ import annotations

import math

import pytest
import torch
from generation_helpers import EOS, PAD, STORY_PROMPTS, prompt_batch

from rlhf_lit.models.generation import SamplingConfig, generate_responses
from rlhf_lit.models.teacher_forced import response_logprobs
from rlhf_lit.models.token_draw import inverse_cdf_draw


def test_inverse_cdf_draw_by_hand():
    """Logits (-inf, 0, ln 3): p = (0, 1/4, 3/4), cumulative (0, 1/4, 1). The first index whose cumulative
    probability exceeds u: u = 0 -> 1 (never the removed token 0), 0.2499 -> 1, 0.25 -> 2 (1/4 does not
    exceed 1/4), 0.9999 -> 2."""
    scores = torch.tensor([[float("-inf"), 0.0, math.log(3.0)]]).expand(4, 3)
    drawn = inverse_cdf_draw(scores, torch.tensor([0.0, 0.2499, 0.25, 0.9999]))
    assert drawn.tolist() == [1, 1, 2, 2]


def test_inverse_cdf_draw_refuses_non_finite_logits():
    """A NaN logit would make every cumulative sum NaN and the index meaningless: refused, as multinomial does."""
    with pytest.raises(ValueError, match="not finite"):
        inverse_cdf_draw(torch.tensor([[0.0, float("nan"), 1.0]]))


def test_inverse_cdf_draw_frequencies():
    """40,000 draws from logits (1, 0, -inf, 2, -3): each token's share within 5 binomial standard errors
    of its softmax probability (by hand: exp(l) / sum), the removed token never drawn."""
    logits = [1.0, 0.0, float("-inf"), 2.0, -3.0]
    total = sum(math.exp(v) for v in logits)
    expected = [math.exp(v) / total for v in logits]
    n = 40_000
    torch.manual_seed(0)
    drawn = inverse_cdf_draw(torch.tensor([logits]).expand(n, 5))
    counts = torch.bincount(drawn, minlength=5).tolist()
    assert counts[2] == 0
    for count, p in zip(counts, expected):
        assert abs(count / n - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1e-12, (counts, expected)


def generate(policy, batch, sampling: SamplingConfig, seed: int, **options):
    """``generate_responses`` on a prompt batch of stories260K, seeded."""
    generator = torch.Generator().manual_seed(seed)
    return generate_responses(
        policy, batch["input_ids"], batch["attention_mask"], sampling, EOS, PAD, generator=generator, **options
    )


def first_token_distribution(policy, batch, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The first response token's sampling distribution for the batch's first prompt, re-derived here:
    softmax(logits / T), top-k (the k largest), then top-p (the most likely tokens until their mass reaches
    p, the one that crosses it kept), renormalised; ``(V,)``."""
    with torch.no_grad():
        logits = policy(input_ids=batch["input_ids"][:1], attention_mask=batch["attention_mask"][:1]).logits[0, -1]
    probs = torch.softmax(logits.double() / temperature, -1)
    order = probs.argsort(descending=True)
    keep = torch.zeros_like(probs, dtype=torch.bool)
    mass = 0.0
    for rank, token in enumerate(order.tolist()):
        if (top_k and rank >= top_k) or mass >= top_p:
            break
        keep[token] = True
        mass += probs[token].item()
    kept = torch.where(keep, probs, 0.0)
    return kept / kept.sum()


@pytest.mark.parametrize("draw", ["inverse_cdf", "multinomial"])
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 6, 1.0), (1.3, 0, 0.8)])
def test_generate_draws_from_the_sampling_distribution(policy, tokenizer, draw, temperature, top_k, top_p):
    """3,000 one-token replies to one prompt: every token's share within 5 binomial standard errors (plus
    0.002) of the distribution re-derived from the model's logits, and no token outside it drawn."""
    n = 3000
    batch = prompt_batch(tokenizer, [STORY_PROMPTS[1]] * n)
    sampling = SamplingConfig(max_new_tokens=1, temperature=temperature, top_k=top_k, top_p=top_p, draw=draw)
    gen = generate(policy, batch, sampling, seed=5)
    expected = first_token_distribution(policy, batch, temperature, top_k, top_p)
    shares = torch.bincount(gen.response_ids[:, 0], minlength=expected.numel()).double() / n
    assert shares[expected == 0].sum() == 0
    bound = 5 * torch.sqrt(expected * (1 - expected) / n) + 0.002
    assert ((shares - expected).abs() <= bound).all(), (shares[expected > 0], expected[expected > 0])
    assert (expected > 0).sum() >= 3  # a distribution with room to get wrong


def test_inverse_cdf_records_the_raw_logprobs(policy, tokenizer):
    """The logprobs recorded while drawing by inverse CDF are the teacher-forced pass's at the temperature,
    over the whole vocabulary (the recorder runs before the warpers and the draw), at every response token."""
    batch = prompt_batch(tokenizer, STORY_PROMPTS * 2)
    sampling = SamplingConfig(max_new_tokens=8, temperature=0.7, top_k=5, draw="inverse_cdf")
    gen = generate(policy, batch, sampling, seed=1, return_logprobs=True)
    with torch.no_grad():
        forced = response_logprobs(policy, gen, 0.7)  # (B, R)
    mask = gen.response_mask
    assert mask.sum() > 20
    torch.testing.assert_close(gen.logprobs[mask], forced[mask], atol=1e-5, rtol=1e-5)


def test_sampling_config_refuses_an_unknown_draw():
    with pytest.raises(ValueError, match="sampling.draw must be one of multinomial, inverse_cdf"):
        SamplingConfig(draw="gumbel")

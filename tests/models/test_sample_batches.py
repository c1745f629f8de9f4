"""Batching prompt strings for the library's sampler (:func:`rlhf_lit.models.generation.sample_batches`):
order, left padding, seeding, refusals.

Sampling itself, decoding and logprobs are tested in ``tests/models/test_generation.py`` and
``tests/evaluation/test_texts.py``.
"""

from __future__ import annotations

import pytest
import torch

from rlhf_lit.models import load_causal_lm
from rlhf_lit.models.generation import SamplingConfig, sample_batches
from rlhf_lit.tokenizer import load_tokenizer

PROMPTS = ["Once upon a time", "Tom had a big red", "The cat"]


@pytest.fixture(scope="module")
def stories(stories_path):
    tok = load_tokenizer(stories_path, padding_side="left")
    return load_causal_lm(stories_path, tok).eval(), tok


def test_batches_follow_the_prompts_left_padded_seeded_and_leave_global_rng_alone(stories):
    model, tok = stories

    def run(seed, batch_size=2):
        return sample_batches(model, tok, PROMPTS, SamplingConfig(max_new_tokens=6), batch_size=batch_size, seed=seed)

    state = torch.random.get_rng_state()
    first = run(3)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert [g.query_responses.shape[0] for g in first] == [2, 1]
    for gen, chunk in zip(first, [PROMPTS[:2], PROMPTS[2:]]):
        enc = tok(chunk, return_tensors="pt", padding=True)  # left padded: "The cat" alone has no pad
        P = enc["input_ids"].shape[1]
        assert torch.equal(gen.query_responses[:, :P], enc["input_ids"])
        assert torch.equal(gen.attention_mask[:, :P], enc["attention_mask"])
        assert gen.response_ids.shape[1] <= 6
    assert (first[0].attention_mask[:, 0] == 0).any()  # the two prompts differ in length: one is padded
    assert all(torch.equal(a.query_responses, b.query_responses) for a, b in zip(first, run(3)))
    assert not all(torch.equal(a.query_responses, b.query_responses) for a, b in zip(first, run(4)))


def test_refuses_an_empty_batch_and_right_padding(stories, stories_path):
    model, tok = stories
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        sample_batches(model, tok, PROMPTS, SamplingConfig(max_new_tokens=2), batch_size=0, seed=0)
    right = load_tokenizer(stories_path)  # padding_side="right" by default
    with pytest.raises(ValueError, match="left-padding tokenizer"):
        sample_batches(model, right, PROMPTS, SamplingConfig(max_new_tokens=2), batch_size=2, seed=0)

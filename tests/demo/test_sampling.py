"""Sampling: seeding, EOS handling in decoding, and logprobs that match the sampling distribution."""

from __future__ import annotations

import pytest
import torch

from rlhf_lit.demo.sampling import Generation, SamplingConfig, decode, generate, load_model, response_logprobs
from rlhf_lit.functional import response_mask_from_eos


@pytest.fixture(scope="module")
def stories(stories_path):
    return load_model(stories_path)


def test_generate_is_seeded_and_restores_global_rng(stories):
    model, tok = stories
    prompts = ["Once upon a time", "Tom had a big red"]

    def run(seed):
        cfg = SamplingConfig(max_new_tokens=6, batch_size=1, seed=seed)
        return [b.response_ids for b in generate(model, tok, prompts, cfg)]

    state = torch.random.get_rng_state()
    first = run(3)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(a, b) for a, b in zip(first, run(3)))
    assert not all(torch.equal(a, b) for a, b in zip(first, run(4)))
    assert [tuple(ids.shape) for ids in first] == [(1, 6), (1, 6)]


def test_sampling_config_rejects_bad_values():
    with pytest.raises(ValueError, match="temperature must be > 0"):
        SamplingConfig(temperature=0.0)
    with pytest.raises(ValueError, match="max_new_tokens and batch_size"):
        SamplingConfig(batch_size=0)


def _hand_batch(tok, eos_row0_at: int) -> Generation:
    """Two left-padded prompts; row 0's response has EOS at ``eos_row0_at`` then pads, row 1 none."""
    enc = tok(["Once upon a time", "Tom and his mom went to the"], return_tensors="pt", padding=True)
    # The ids a model generates after the prompt: tokenized jointly with it (alone, sentencepiece
    # would start " there" with a spurious space token).
    prompt_ids = tok("Once upon a time", add_special_tokens=False)["input_ids"]
    joint = tok("Once upon a time there was a big dog", add_special_tokens=False)["input_ids"]
    assert joint[: len(prompt_ids)] == prompt_ids
    words = joint[len(prompt_ids) :]
    row0 = words[:eos_row0_at] + [tok.eos_token_id]
    row0 += [tok.pad_token_id] * (len(words) - len(row0))
    response_ids = torch.tensor([row0, words])  # (2, R)
    mask, ended = response_mask_from_eos(response_ids, tok.eos_token_id)
    return Generation(enc["input_ids"], enc["attention_mask"], response_ids, mask, ended)


def test_decode_stops_at_eos(stories):
    _, tok = stories
    batch = _hand_batch(tok, eos_row0_at=3)
    R = batch.response_ids.shape[1]
    assert batch.response_mask[0].tolist() == [True] * 4 + [False] * (R - 4)
    assert batch.response_mask[1].tolist() == [True] * R
    assert batch.ended.tolist() == [True, False]
    prompts, responses = decode(tok, batch)
    assert prompts == ["Once upon a time", "Tom and his mom went to the"]
    # the first 3 tokens of " there was a big dog" are " there", " was", " a"
    assert responses == [" there was a", " there was a big dog"]


def test_decode_gpt2_with_added_pad(gpt2_dir):
    _, tok = load_model(gpt2_dir)
    assert tok.pad_token_id == 50257  # added by load_tokenizer: GPT-2 has no pad
    batch = _hand_batch(tok, eos_row0_at=2)
    prompts, responses = decode(tok, batch)
    assert prompts == ["Once upon a time", "Tom and his mom went to the"]
    assert responses == [" there was", " there was a big dog"]


@pytest.mark.parametrize("which", ["stories", "gpt2"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_response_logprobs_match_the_sampling_distribution(stories, gpt2_dir, which, temperature):
    # GPT-2's absolute positions make this fail without position_ids = cumsum(mask) - 1 (llama's
    # rotary positions are shift invariant, so only the GPT-2 case checks the left-pad positions).
    model, tok = stories if which == "stories" else load_model(gpt2_dir)
    enc = tok(["Once upon a time", "Lily and Tom went to the park to"], return_tensors="pt", padding=True)
    assert enc["attention_mask"][0, 0] == 0  # row 0 is left padded
    torch.manual_seed(0)
    out = model.generate(
        **enc, do_sample=True, temperature=temperature, top_k=0, top_p=1.0, max_new_tokens=5,
        output_scores=True, return_dict_in_generate=True, pad_token_id=tok.pad_token_id,
    )
    response_ids = out.sequences[:, enc["input_ids"].shape[1] :]  # (2, 5)
    # generate's scores are the logits after the temperature warper: the sampling distribution.
    scores = torch.stack(out.scores, dim=1)  # (2, 5, V)
    expected = torch.log_softmax(scores, -1).gather(-1, response_ids.unsqueeze(-1)).squeeze(-1)  # (2, 5)
    mask, ended = response_mask_from_eos(response_ids, tok.eos_token_id)
    batch = Generation(enc["input_ids"], enc["attention_mask"], response_ids, mask, ended)
    torch.testing.assert_close(response_logprobs(model, batch, temperature), expected)

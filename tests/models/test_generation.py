"""Generation: masks and pads after EOS, and logprobs that match the sampling distribution exactly."""

from __future__ import annotations

import shutil

import pytest
import torch
from assets_paths import GPT2_TOKENIZER
from generation_helpers import EOS, PAD, STORY_PROMPTS, prompt_batch
from transformers import GenerationConfig

from rlhf_lit.functional import token_logprobs
from rlhf_lit.models import load_causal_lm
from rlhf_lit.models.generation import SamplingConfig, complete_generation, generate_responses
from rlhf_lit.models.teacher_forced import forward_with_positions, response_logits
from rlhf_lit.tokenizer import load_tokenizer

PROMPTS = STORY_PROMPTS


def test_complete_generation_masks_and_pads_after_first_eos():
    prompt_mask = torch.tensor([[0, 1], [1, 1], [1, 1]])
    sequences = torch.tensor(
        [
            [PAD, 9, 5, EOS, 7, EOS],  # EOS at response position 1, junk after it
            [8, 9, 5, 6, 7, 8],  # no EOS: all four tokens count
            [8, 9, EOS, 3, 3, 3],  # EOS first: only the EOS counts
        ]
    )
    gen = complete_generation(sequences, prompt_mask, EOS, PAD)
    assert gen.response_mask.tolist() == [[True, True, False, False], [True] * 4, [True, False, False, False]]
    assert gen.ended.tolist() == [True, False, True]
    assert gen.response_ids.tolist() == [[5, EOS, PAD, PAD], [5, 6, 7, 8], [EOS, PAD, PAD, PAD]]
    assert gen.query_responses.tolist() == [[PAD, 9, 5, EOS, PAD, PAD], [8, 9, 5, 6, 7, 8], [8, 9, EOS, PAD, PAD, PAD]]
    assert gen.attention_mask.tolist() == [[0, 1, 1, 1, 0, 0], [1] * 6, [1, 1, 1, 0, 0, 0]]


def test_sampled_responses_stop_at_eos_and_are_masked_after_it(policy, tokenizer):
    batch = prompt_batch(tokenizer, PROMPTS * 2)
    sampling = SamplingConfig(max_new_tokens=10, temperature=0.9)
    gen = generate_responses(
        policy,
        batch["input_ids"],
        batch["attention_mask"],
        sampling,
        EOS,
        PAD,
        generator=torch.Generator().manual_seed(5),
    )
    lengths = []
    for ids, mask, ended in zip(gen.response_ids.tolist(), gen.response_mask.tolist(), gen.ended.tolist()):
        first = ids.index(EOS) if EOS in ids else None
        assert ended == (first is not None)
        n = len(ids) if first is None else first + 1
        assert mask == [t < n for t in range(len(ids))]
        assert all(tok == PAD for tok in ids[n:])
        lengths.append(n)
    # The biased EOS gives both ended and unfinished rows, of several lengths.
    assert any(gen.ended.tolist()) and not all(gen.ended.tolist())
    assert len(set(lengths)) >= 3
    P = batch["input_ids"].shape[1]
    assert torch.equal(gen.attention_mask[:, P:], gen.response_mask.long())
    assert torch.equal(gen.attention_mask[:, :P], batch["attention_mask"])


@pytest.mark.parametrize("draw", ["multinomial", "inverse_cdf"])
def test_generator_decides_samples_and_leaves_global_rng_alone(policy, tokenizer, draw):
    batch = prompt_batch(tokenizer, PROMPTS)
    sampling = SamplingConfig(max_new_tokens=6, draw=draw)

    def run(seed):
        return generate_responses(
            policy,
            batch["input_ids"],
            batch["attention_mask"],
            sampling,
            EOS,
            PAD,
            generator=torch.Generator().manual_seed(seed),
        ).query_responses

    torch.manual_seed(123)
    before = torch.get_rng_state()
    a, b, c = run(1), run(1), run(2)
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """A tiny random GPT-2 (absolute positions) with the real GPT-2 tokenizer (pad added)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    directory = tmp_path_factory.mktemp("gpt2")
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(GPT2_TOKENIZER / name, directory / name)
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64)).save_pretrained(directory)
    tok = load_tokenizer(str(directory), padding_side="left")
    tok.save_pretrained(directory)
    return load_causal_lm(str(directory), tok).eval(), tok


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_teacher_forced_logprobs_match_generate_exactly(family, policy, tokenizer, gpt2):
    """Temperature 0.7, left padding: the forward pass with cumsum positions reproduces generate's logits."""
    model, tok = (policy, tokenizer) if family == "llama" else gpt2
    eos, pad = tok.eos_token_id, tok.pad_token_id
    batch = prompt_batch(tok, PROMPTS)
    sampling = SamplingConfig(max_new_tokens=8, temperature=0.7)
    config = GenerationConfig(
        max_new_tokens=8,
        do_sample=True,
        temperature=0.7,
        top_k=0,
        top_p=1.0,
        eos_token_id=eos,
        pad_token_id=pad,
        return_dict_in_generate=True,
        output_logits=True,
    )
    torch.manual_seed(11)
    out = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], generation_config=config)
    gen = complete_generation(out.sequences, batch["attention_mask"], eos, pad)
    torch.manual_seed(11)
    same = generate_responses(model, batch["input_ids"], batch["attention_mask"], sampling, eos, pad)
    assert torch.equal(same.query_responses, gen.query_responses)
    assert batch["attention_mask"][:, 0].tolist() != [1] * len(PROMPTS)  # really left padded

    sampled = token_logprobs(torch.stack(out.logits, dim=1), gen.response_ids, temperature=0.7)  # (B, R)
    P = batch["input_ids"].shape[1]
    mask = gen.response_mask
    with torch.no_grad():
        logits = forward_with_positions(model, gen.query_responses, gen.attention_mask).logits
        forced = token_logprobs(response_logits(logits, P), gen.response_ids, temperature=0.7)  # (B, R)
        if family == "gpt2":
            # Absolute positions: without cumsum positions the padded rows see shifted positions.
            plain = model(input_ids=gen.query_responses, attention_mask=gen.attention_mask).logits
            unpositioned = token_logprobs(response_logits(plain, P), gen.response_ids, temperature=0.7)
            assert (unpositioned[mask] - sampled[mask]).abs().max() > 1e-3
    torch.testing.assert_close(forced[mask], sampled[mask])
    # Temperature matters too: logprobs at T=1 are another distribution.
    at_one = token_logprobs(response_logits(logits, P), gen.response_ids)
    assert (at_one[mask] - sampled[mask]).abs().max() > 1e-3


def test_sampling_config_refuses_temperature_with_greedy():
    with pytest.raises(ValueError, match="greedily"):
        SamplingConfig(do_sample=False, temperature=0.7)
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=0.0)


def test_sampling_config_refuses_no_new_tokens():
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        SamplingConfig(max_new_tokens=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_teacher_forced_logprobs_are_the_distribution_generate_sampled_from(
    family, temperature, policy, tokenizer, gpt2
):
    """Against generate's processed scores (the logits after its temperature warper), not its raw logits.

    The check the demo's evaluation relies on: ``token_logprobs(..., temperature)`` of the
    forward pass with cumsum positions is the log-softmax generate sampled from, left padding included.
    """
    model, tok = (policy, tokenizer) if family == "llama" else gpt2
    eos, pad = tok.eos_token_id, tok.pad_token_id
    batch = prompt_batch(tok, PROMPTS)
    config = GenerationConfig(
        max_new_tokens=6,
        do_sample=True,
        temperature=temperature,
        top_k=0,
        top_p=1.0,
        eos_token_id=eos,
        pad_token_id=pad,
        return_dict_in_generate=True,
        output_scores=True,
    )
    torch.manual_seed(3)
    out = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], generation_config=config)
    gen = complete_generation(out.sequences, batch["attention_mask"], eos, pad)
    sampled = torch.log_softmax(torch.stack(out.scores, dim=1), -1)  # (B, R, V): the sampling distribution
    sampled = sampled.gather(-1, gen.response_ids.unsqueeze(-1)).squeeze(-1)  # (B, R)
    with torch.no_grad():
        logits = forward_with_positions(model, gen.query_responses, gen.attention_mask).logits  # (B, P + R, V)
    P = batch["input_ids"].shape[1]
    forced = token_logprobs(response_logits(logits, P), gen.response_ids, temperature)  # (B, R)
    torch.testing.assert_close(forced[gen.response_mask], sampled[gen.response_mask])


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_response_texts_of_generated_rows_end_before_the_first_eos(family, tokenizer, gpt2):
    """``complete_generation`` then ``response_texts``: real words after an EOS are dropped, the leading
    space is kept, and GPT-2's added pad (id 50257) never shows up as text."""
    from rlhf_lit.evaluation import response_texts

    tok = tokenizer if family == "llama" else gpt2[1]
    if family == "gpt2":
        assert tok.pad_token_id == 50257  # added by load_tokenizer: GPT-2 has no pad
    eos, pad = tok.eos_token_id, tok.pad_token_id
    batch = prompt_batch(tok, ["Once upon a time", "Tom and his mom went to the"])
    # The ids a model generates after the prompt: tokenized jointly with it (alone, sentencepiece
    # would start " there" with a spurious space token).
    prompt_ids = tok("Once upon a time", add_special_tokens=False)["input_ids"]
    joint = tok("Once upon a time there was a big dog", add_special_tokens=False)["input_ids"]
    assert joint[: len(prompt_ids)] == prompt_ids
    words = joint[len(prompt_ids) :]  # " there was a big dog"
    row0 = words[:3] + [eos] + words[3:-1]  # EOS after " there was a", then real words (junk)
    responses = torch.tensor([row0, words])  # (2, R); row 1 has no EOS
    gen = complete_generation(torch.cat([batch["input_ids"], responses], 1), batch["attention_mask"], eos, pad)
    assert gen.ended.tolist() == [True, False]
    texts = response_texts(tok, gen.query_responses, gen.attention_mask, gen.response_mask, gen.ended)
    assert texts == [" there was a", " there was a big dog"]

"""Logprobs and entropies recorded while sampling (``StepLogprobs``): the values the stacked
``(B, R, V)`` logits of ``output_logits`` gave, without keeping them."""

from __future__ import annotations

import math

import pytest
import torch
from generation_helpers import EOS, PAD, STORY_PROMPTS, prompt_batch
from transformers import GenerationConfig, LogitsProcessorList

from rlhf_lit.functional import entropy_from_logits, token_logprobs
from rlhf_lit.models.generation import SamplingConfig, generate_responses
from rlhf_lit.models.step_logprobs import StepLogprobs
from rlhf_lit.models.teacher_forced import response_logprobs

PROMPTS = STORY_PROMPTS


def test_step_logprobs_by_hand():
    """V = 2. Step 0: logits (0, ln 3) at T = 1 -> p = (1/4, 3/4); token 1 drawn: log 3/4 = -0.2876821,
    entropy -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.5623351. Step 1: logits (ln 2, 0) at T = 1 -> (2/3, 1/3);
    token 0: log 2/3 = -0.4054651, entropy 0.6365142. A third step recorded past the two tokens
    returned (CUDA's deferred stop check) is dropped."""
    recorder = StepLogprobs(temperature=1.0)
    ids = torch.tensor([[5]])
    recorder(ids, torch.tensor([[0.0, math.log(3)]]))
    recorder(torch.tensor([[5, 1]]), torch.tensor([[math.log(2), 0.0]]))
    recorder(torch.tensor([[5, 1, 0]]), torch.tensor([[9.0, -9.0]]))  # the undone extra step
    logprobs, entropy = recorder.finish(torch.tensor([[1, 0]]))
    torch.testing.assert_close(logprobs, torch.tensor([[-0.2876821, -0.4054651]]))
    torch.testing.assert_close(entropy, torch.tensor([[0.5623351, 0.6365142]]))


def test_step_logprobs_divide_by_the_temperature():
    """T = 0.5 on logits (0, ln 3 / 2): the scaled logits are (0, ln 3), so the values of the test above."""
    recorder = StepLogprobs(temperature=0.5)
    recorder(torch.tensor([[5]]), torch.tensor([[0.0, math.log(3) / 2]]))
    logprobs, entropy = recorder.finish(torch.tensor([[1]]))
    torch.testing.assert_close(logprobs, torch.tensor([[-0.2876821]]))
    torch.testing.assert_close(entropy, torch.tensor([[0.5623351]]))


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 0.9)])
def test_recorded_values_are_those_of_the_stacked_logits(policy, tokenizer, temperature, top_k, top_p):
    """One ``generate`` call with both the recorder and ``output_logits``: the recorded logprobs of the
    drawn tokens and the entropies equal ``token_logprobs`` / ``entropy_from_logits`` of the stacked
    ``(B, R, V)`` raw logits (the former sampling path), at every position, pads included. With
    top-k / top-p the recorder still sees the raw logits (it runs before generate's warpers): a
    recorder after them would score the truncated distribution."""
    batch = prompt_batch(tokenizer, PROMPTS * 2)
    recorder = StepLogprobs(temperature)
    config = GenerationConfig(
        max_new_tokens=10,
        do_sample=True,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_token_id=EOS,
        pad_token_id=PAD,
        output_logits=True,
        return_dict_in_generate=True,
    )
    torch.manual_seed(11)
    with torch.no_grad():
        out = policy.generate(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            generation_config=config,
            logits_processor=LogitsProcessorList([recorder]),
        )
    P = batch["input_ids"].shape[1]
    tokens = out.sequences[:, P:]  # (B, R)
    logits = torch.stack(out.logits, dim=1)  # (B, R, V): what the former path kept
    assert (tokens == EOS).any() and (tokens == PAD).any()  # rows end at different steps
    logprobs, entropy = recorder.finish(tokens)
    torch.testing.assert_close(logprobs, token_logprobs(logits, tokens, temperature), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(entropy, entropy_from_logits(logits, temperature), rtol=1e-6, atol=1e-6)


def test_generate_responses_records_without_changing_the_samples(policy, tokenizer):
    """Left-padded prompts, temperature 0.7: recording leaves the samples as they were; the recorded
    logprobs of the response tokens are the teacher-forced forward's up to float rounding (fp32,
    measured <= 1e-5) and a one-position shift of them is off by far more."""
    batch = prompt_batch(tokenizer, PROMPTS * 2)
    sampling = SamplingConfig(max_new_tokens=10, temperature=0.7)

    def run(record: bool):
        return generate_responses(
            policy,
            batch["input_ids"],
            batch["attention_mask"],
            sampling,
            EOS,
            PAD,
            generator=torch.Generator().manual_seed(4),
            return_logprobs=record,
        )

    plain, recorded = run(False), run(True)
    assert plain.logprobs is None and plain.entropy is None
    assert torch.equal(plain.query_responses, recorded.query_responses)
    assert recorded.logprobs.shape == recorded.entropy.shape == recorded.response_ids.shape
    mask = recorded.response_mask
    assert not mask.all() and mask.sum(1).unique().numel() >= 3  # pads after EOS, several lengths
    with torch.no_grad():
        forced = response_logprobs(policy, recorded, sampling.temperature)  # (B, R)
    torch.testing.assert_close(recorded.logprobs[mask], forced[mask], rtol=0, atol=5e-5)
    shifted = torch.roll(recorded.logprobs, 1, dims=1)
    assert (shifted[mask] - forced[mask]).abs().max() > 0.1
    rows = recorded.rows(2, 5)
    assert torch.equal(rows.logprobs, recorded.logprobs[2:5]) and torch.equal(rows.entropy, recorded.entropy[2:5])

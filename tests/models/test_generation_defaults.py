"""Sampling ignores a checkpoint's generation_config.json: only SamplingConfig shapes what is drawn.

``generate`` fills whatever the passed ``GenerationConfig`` leaves unset from the model's
``generation_config`` (Qwen2.5-Instruct ships ``repetition_penalty: 1.05``, many chat models set
``min_p`` or ``no_repeat_ngram_size``). PPO computes old / new / reference logprobs from
``softmax(logits / temperature)``; tokens drawn from a distribution reshaped by those processors
would make the "on-policy" samples and the KL estimate silently wrong.
"""

from __future__ import annotations

import pytest
import torch
from generation_helpers import EOS, PAD, STORIES, prompt_batch

from rlhf_lit.models import load_causal_lm
from rlhf_lit.models.generation import SamplingConfig, generate_responses
from rlhf_lit.tokenizer import load_tokenizer

PROMPTS = ["Once upon a time there was", "The cat", "Lily and Tom went to the park to", "A"]


@pytest.fixture()
def tokenizer():
    return load_tokenizer(STORIES, padding_side="left")


@pytest.fixture()
def policy(tokenizer):
    return load_causal_lm(STORIES, tokenizer).eval()


@pytest.mark.parametrize("with_generator", [True, False])
def test_model_generation_config_does_not_reshape_sampling(policy, tokenizer, with_generator):
    batch = prompt_batch(tokenizer, PROMPTS)
    sampling = SamplingConfig(max_new_tokens=12, temperature=0.9)

    def run():
        generator = torch.Generator().manual_seed(11) if with_generator else None
        if not with_generator:
            torch.manual_seed(11)
        return generate_responses(
            policy, batch["input_ids"], batch["attention_mask"], sampling, EOS, PAD, generator=generator
        ).query_responses

    plain = run()
    # What a checkpoint's generation_config.json may carry; none of it is in SamplingConfig.
    defaults = policy.generation_config
    defaults.repetition_penalty = 50.0
    defaults.no_repeat_ngram_size = 1
    defaults.min_new_tokens = 12
    defaults.top_k = 3
    with_defaults = run()
    assert torch.equal(with_defaults, plain)
    # The model's own settings are put back (its export still carries them).
    assert policy.generation_config is defaults and defaults.repetition_penalty == 50.0

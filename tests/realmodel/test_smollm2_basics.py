"""A real instruction model through rlhf-lit's loaders: ChatML, an end of turn that is also the pad, tied embeddings.

SmolLM2-135M-Instruct's tokenizer pads with ``<|im_end|>``, the token that ends every turn: masks
must come from attention masks and EOS positions, never from pad ids (docs/CONTRACTS.md).
"""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from rlhf_lit.data.encoding import TextEncoder
from rlhf_lit.models import load_causal_lm, load_reward_model, sequence_scores
from rlhf_lit.models.generation import SamplingConfig, generate_responses, stop_token_ids
from rlhf_lit.tokenizer import load_tokenizer

# Not slow: a few seconds once the model is built (the fixture's first run, ~1 min, is a one-off).
pytestmark = pytest.mark.realmodel

END = "<|im_end|>"
QUESTIONS = ("What is the capital of France?", "What is 2 + 2?")


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    """The model's tokenizer as PPO loads it: left padding, the default missing-pad policy (add one)."""
    return load_tokenizer(str(smollm2_path), padding_side="left")


@pytest.fixture(scope="module")
def policy(smollm2_path, tokenizer):
    """The causal LM through :func:`load_causal_lm`."""
    return load_causal_lm(str(smollm2_path), tokenizer)


def test_the_end_of_turn_is_eos_and_pad_and_the_model_stops_at_it(smollm2_path, tokenizer):
    end = tokenizer.convert_tokens_to_ids(END)
    assert tokenizer.chat_template
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (end, end)
    assert len(tokenizer) == 49152  # the pad was there: load_tokenizer added none
    assert TextEncoder(tokenizer, apply_chat_template=True).end_of_turn_id() == end
    assert GenerationConfig.from_pretrained(smollm2_path).eos_token_id == end


def test_a_rendered_prompt_ends_with_the_generation_prompt(tokenizer):
    encoder = TextEncoder(tokenizer, apply_chat_template=True)
    assert encoder.render_prompt(QUESTIONS[0]).endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = encoder.encode_prompts([QUESTIONS[0]])[0]
    assert ids[-4:] == tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]


def test_greedy_answers_stop_at_the_end_of_turn_which_the_response_mask_counts(policy, tokenizer):
    end = tokenizer.convert_tokens_to_ids(END)
    batch = tokenizer.pad(
        {"input_ids": TextEncoder(tokenizer, apply_chat_template=True).encode_prompts(QUESTIONS)}, return_tensors="pt"
    )
    generated = generate_responses(
        policy,
        batch["input_ids"],
        batch["attention_mask"],
        SamplingConfig(max_new_tokens=32, do_sample=False),
        eos_token_id=stop_token_ids(policy, tokenizer),
        pad_token_id=tokenizer.pad_token_id,
    )
    assert generated.ended.tolist() == [True, True]
    lengths = []
    for ids, mask in zip(generated.response_ids.tolist(), generated.response_mask.tolist()):
        stop = ids.index(end)  # the first <|im_end|>: every later position holds the pad, the same id
        assert mask == [True] * (stop + 1) + [False] * (len(ids) - stop - 1)
        lengths.append(stop + 1)
    assert len(set(lengths)) == 2  # one row is padded after its end, with the id the end itself has
    answer = tokenizer.decode(generated.response_ids[0][: lengths[0]])
    assert "Paris" in answer and answer.endswith(END), answer


def test_the_lm_head_is_the_embedding_after_loading(policy):
    assert policy.lm_head.weight is policy.get_input_embeddings().weight
    assert policy.lm_head.weight.data_ptr() == policy.get_input_embeddings().weight.data_ptr()


def test_the_reward_model_reads_each_rows_end_of_turn_not_the_pad_after_it(smollm2_path, tokenizer):
    torch.manual_seed(0)
    reward = load_reward_model(str(smollm2_path), tokenizer, new_head=True)
    encoder = TextEncoder(tokenizer, apply_chat_template=True)
    end = tokenizer.convert_tokens_to_ids(END)
    rows = [
        encoder.encode_prompts([q])[0] + tokenizer(a, add_special_tokens=False)["input_ids"] + [end]
        for q, a in zip(QUESTIONS, ("Paris.", "2 + 2 is 4, as anyone can check."))
    ]
    width = max(map(len, rows))
    ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])  # right padded with <|im_end|>
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    with torch.no_grad():
        together = sequence_scores(reward, ids, mask)
        # The head read at each row's own last token, its <|im_end|>, computed apart from rlhf-lit's code.
        alone = torch.stack(
            [reward.score(reward.model(input_ids=torch.tensor([r])).last_hidden_state[0, -1])[0] for r in rows]
        )
    assert rows[0] != rows[1] and len(rows[0]) < width
    torch.testing.assert_close(together, alone, rtol=1e-4, atol=1e-4)

"""Grouped-query attention (9 query heads, 3 key / value heads) under ``ppo.forward: compiled`` and
``sampling.decode: compiled`` on SmolLM2.

The compiled pass pads the rows to buckets (prompt columns left, response columns right, unattended)
and runs the layers through inductor (2 of the 30 for the forward pass; all 30 for decoding, whose
greedy answers must end their turn); its logits must be the eager pass's up to the float32
rounding of another summation order (tests/float32_bounds.py), and both must be each row's own
logits computed alone, unpadded, by plain transformers.
"""

from __future__ import annotations

import pytest
import torch
from float32_bounds import entropy_bound, largest_logit, logprob_bound, output_bound

from rlhf_lit.data.encoding import TextEncoder
from rlhf_lit.models import load_causal_lm
from rlhf_lit.models.compiled_generation import cache_length
from rlhf_lit.models.compiled_passes import bucket_length
from rlhf_lit.models.generation import SamplingConfig, generate_responses, stop_token_ids
from rlhf_lit.stages.ppo.forward import ForwardPassRunner
from rlhf_lit.tokenizer import load_tokenizer

# Slow: inductor compiles the decode step of 30 layers on the CPU (79 s alone on 2 cores, empty cache).
pytestmark = [pytest.mark.realmodel, pytest.mark.slow, pytest.mark.kernels]

PROMPTS = ("What is the capital of France?", "Hi!", "Name two colours, please.")
ANSWERS = ("Paris.", "Hello! How can I help?", "Red and")  # the last one unfinished: no end of turn


def test_compiled_forward_gives_the_eager_logits_with_grouped_query_attention(smollm2_two_layers):
    # 2 of the 30 layers (tests/realmodel/conftest.py): the same grouped-query attention and padding, a
    # bound that follows the copy's config, and a fifteenth of the layers for inductor to lower
    smollm2_path = smollm2_two_layers
    tokenizer = load_tokenizer(str(smollm2_path), padding_side="left")
    policy = load_causal_lm(str(smollm2_path), tokenizer).eval()
    config = policy.config
    assert config.num_attention_heads // config.num_key_value_heads == 3  # grouped: what this test is about
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompts = TextEncoder(tokenizer, apply_chat_template=True).encode_prompts(list(PROMPTS))
    answers = [tokenizer(a, add_special_tokens=False)["input_ids"] for a in ANSWERS]
    answers = [a + [end] for a in answers[:2]] + answers[2:]
    width_p, width_r = max(map(len, prompts)), max(map(len, answers))
    rows = [[end] * (width_p - len(p)) + p + a + [end] * (width_r - len(a)) for p, a in zip(prompts, answers)]
    mask = [
        [0] * (width_p - len(p)) + [1] * (len(p) + len(a)) + [0] * (width_r - len(a)) for p, a in zip(prompts, answers)
    ]
    ids, mask = torch.tensor(rows), torch.tensor(mask)
    assert len({len(p) for p in prompts}) == 3  # three different left paddings

    with torch.no_grad():
        eager, _ = ForwardPassRunner("eager").policy_and_values(policy, None, ids, mask, width_p)  # (B, R, V)
        runner = ForwardPassRunner("compiled")
        compiled, _ = runner.policy_and_values(policy, None, ids, mask, width_p)
        # Each row alone, unpadded: the logits that predict its response tokens (positions P-1 .. P+n-2).
        alone = [
            policy(input_ids=torch.tensor([p + a])).logits[0, len(p) - 1 : len(p) + len(a) - 1]
            for p, a in zip(prompts, answers)
        ]
    assert runner.stats.graphs == 1
    assert compiled.shape == eager.shape == (3, width_r, config.vocab_size)
    positions = bucket_length(width_p) + bucket_length(width_r)  # the compiled pass's padded rows
    bound = output_bound(config, float(eager.abs().max()), positions)
    for b, a in enumerate(answers):
        n = len(a)  # the response positions the mask counts; the rest predict from a pad and are never read
        torch.testing.assert_close(compiled[b, :n], eager[b, :n], rtol=0, atol=bound)
        torch.testing.assert_close(eager[b, :n], alone[b], rtol=0, atol=bound)


def test_compiled_greedy_decoding_writes_the_eager_tokens_and_stops_at_the_end_of_turn(smollm2_path):
    tokenizer = load_tokenizer(str(smollm2_path), padding_side="left")
    policy = load_causal_lm(str(smollm2_path), tokenizer).eval()
    prompts = TextEncoder(tokenizer, apply_chat_template=True).encode_prompts(["What is the capital of France?", "Hi!"])
    batch = tokenizer.pad({"input_ids": prompts}, return_tensors="pt")
    out = {}
    for decode in ("eager", "compiled"):
        sampling = SamplingConfig(max_new_tokens=12, do_sample=False, decode=decode)
        out[decode] = generate_responses(
            policy,
            batch["input_ids"],
            batch["attention_mask"],
            sampling,
            stop_token_ids(policy, tokenizer),
            tokenizer.pad_token_id,
            return_logprobs=True,
        )
    eager, compiled = out["eager"], out["compiled"]
    config = policy.config
    magnitude = largest_logit(policy, eager.query_responses, eager.attention_mask)
    longest = cache_length(batch["input_ids"].shape[1], 12)  # the static cache the compiled step attends over
    # Identical greedy tokens follow from the bound only where eager's best logit leads the second by
    # more than twice the bound (each may move by it): check that first, so equality is derived, not luck.
    with torch.no_grad():
        positions = (eager.attention_mask.cumsum(1) - 1).clamp(min=0)
        logits = policy(
            input_ids=eager.query_responses, attention_mask=eager.attention_mask, position_ids=positions
        ).logits[:, batch["input_ids"].shape[1] - 1 : -1]  # (B, R, V)
    top2 = logits.topk(2, dim=-1).values
    margins = (top2[..., 0] - top2[..., 1])[eager.response_mask]
    assert float(margins.min()) > 2 * output_bound(config, magnitude, longest)
    assert eager.ended.all() and len(set(eager.response_mask.sum(1).tolist())) == 2  # two lengths, pad after one
    assert torch.equal(compiled.query_responses, eager.query_responses)
    assert torch.equal(compiled.response_mask, eager.response_mask)
    torch.testing.assert_close(
        compiled.logprobs, eager.logprobs, rtol=0, atol=logprob_bound(config, magnitude, longest)
    )
    torch.testing.assert_close(
        compiled.entropy,
        eager.entropy,
        rtol=0,
        atol=entropy_bound(config, magnitude, float(eager.entropy.max()), longest),
    )

"""Grouped-query attention (9 query heads, 3 key / value heads) under ``ppo.forward: compiled`` on SmolLM2.

The compiled pass pads the rows to buckets (prompt columns left, response columns right, unattended)
and runs the 30 layers through inductor; its logits must be the eager pass's up to the float32
rounding of another summation order (tests/float32_bounds.py), and both must be each row's own
logits computed alone, unpadded, by plain transformers.
"""

from __future__ import annotations

import pytest
import torch

from float32_bounds import output_bound
from rlhf_lit.data.encoding import TextEncoder
from rlhf_lit.models import load_causal_lm
from rlhf_lit.stages.ppo.forward import ForwardPassRunner
from rlhf_lit.tokenizer import load_tokenizer

# Slow: inductor compiles the 30-layer graph on the CPU (minutes on 2 cores).
pytestmark = [pytest.mark.realmodel, pytest.mark.slow]

PROMPTS = ("What is the capital of France?", "Hi!", "Name two colours, please.")
ANSWERS = ("Paris.", "Hello! How can I help?", "Red and")  # the last one unfinished: no end of turn


def test_compiled_forward_gives_the_eager_logits_with_grouped_query_attention(smollm2_path):
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
    mask = [[0] * (width_p - len(p)) + [1] * (len(p) + len(a)) + [0] * (width_r - len(a)) for p, a in zip(prompts, answers)]
    ids, mask = torch.tensor(rows), torch.tensor(mask)
    assert len({len(p) for p in prompts}) == 3  # three different left paddings

    with torch.no_grad():
        eager, _ = ForwardPassRunner("eager").policy_and_values(policy, None, ids, mask, width_p)  # (B, R, V)
        runner = ForwardPassRunner("compiled")
        compiled, _ = runner.policy_and_values(policy, None, ids, mask, width_p)
        # Each row alone, unpadded: the logits that predict its response tokens (positions P-1 .. P+n-2).
        alone = [policy(input_ids=torch.tensor([p + a])).logits[0, len(p) - 1 : len(p) + len(a) - 1]
                 for p, a in zip(prompts, answers)]  # fmt: skip
    assert runner.stats.graphs == 1
    assert compiled.shape == eager.shape == (3, width_r, config.vocab_size)
    bound = output_bound(config, float(eager.abs().max()))
    for b, a in enumerate(answers):
        n = len(a)  # the response positions the mask counts; the rest predict from a pad and are never read
        torch.testing.assert_close(compiled[b, :n], eager[b, :n], rtol=0, atol=bound)
        torch.testing.assert_close(eager[b, :n], alone[b], rtol=0, atol=bound)

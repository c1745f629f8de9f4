"""The causal-LM pass of SFT and DPO (``causal_lm_logits``, ``response_sequence_logprobs``): positions
count real tokens only, so a row left-padded reads the numbers it reads right-padded.

GPT-2 (learned absolute positions) shows it: a rotary model would read the same logits from shifted
positions too, since its attention sees relative positions only."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from rlhf_lit.models.scoring import causal_lm_logits, response_sequence_logprobs


def test_left_and_right_padding_give_the_same_logits_and_sequence_logprobs(gpt2_dir):
    model = AutoModelForCausalLM.from_pretrained(gpt2_dir).eval()
    ids = [5, 9, 14, 3, 27, 8]  # one row of 6 real tokens, padded by 3 on either side
    right, left = torch.tensor([ids + [0] * 3]), torch.tensor([[0] * 3 + ids])  # (1, 9) each
    right_mask, left_mask = torch.tensor([[1] * 6 + [0] * 3]), torch.tensor([[0] * 3 + [1] * 6])
    # The response is the last 3 real tokens: marked where each padding puts them.
    right_response = torch.tensor([[False] * 3 + [True] * 3 + [False] * 3])
    left_response = torch.tensor([[False] * 6 + [True] * 3])
    with torch.no_grad():
        right_logits = causal_lm_logits(model, right, right_mask)[:, :6]  # (1, 6, V): the real positions
        left_logits = causal_lm_logits(model, left, left_mask)[:, 3:]
        right_sum = response_sequence_logprobs(model, right, right_mask, right_response)  # (1,)
        left_sum = response_sequence_logprobs(model, left, left_mask, left_response)
        left_mean = response_sequence_logprobs(model, left, left_mask, left_response, average=True)
    torch.testing.assert_close(left_logits, right_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(left_sum, right_sum, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(left_mean, left_sum / 3)  # the token mean of the same three logprobs

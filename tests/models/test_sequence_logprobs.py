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


def test_only_the_response_positions_logits_are_computed_and_the_sums_are_the_full_passs(gpt2_dir):
    """Rows whose responses start at different columns (right padded, as DPO's pairs are): the logprobs are
    the hand-gathered ones of the full pass, and the LM head ran from the first response token's
    predicting position on (3 of 9 positions left out); a model that ignores logits_to_keep gives the same."""
    model = AutoModelForCausalLM.from_pretrained(gpt2_dir).eval()
    ids = torch.tensor([[5, 9, 14, 3, 27, 8, 0, 0, 0], [7, 2, 11, 6, 19, 4, 12, 30, 0]])
    mask = (ids != 0).long()
    response = torch.zeros_like(ids, dtype=torch.bool)
    response[0, 4:6] = True  # prompt of 4 tokens
    response[1, 6:8] = True  # prompt of 6 tokens
    seen: list[tuple[int, ...]] = []
    model.lm_head.register_forward_hook(lambda m, a, out: seen.append(tuple(out.shape)))
    with torch.no_grad():
        full = torch.log_softmax(causal_lm_logits(model, ids, mask).float(), dim=-1)  # (2, 9, V)
        got = response_sequence_logprobs(model, ids, mask, response)
    want = torch.stack(
        [sum(full[b, t - 1, ids[b, t]] for t in range(9) if response[b, t]) for b in range(2)]
    )  # position t - 1 predicts token t
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert seen[-1][1] == 9 - 3  # positions 3 .. 8: the first response token (column 4) is predicted at 3

    class NoKeep(torch.nn.Module):  # a wrapper whose forward names its arguments and has no logits_to_keep
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, position_ids, use_cache):
            return self.inner(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=use_cache
            )

    with torch.no_grad():
        torch.testing.assert_close(response_sequence_logprobs(NoKeep(model), ids, mask, response), got)
    assert seen[-1][1] == 9

"""token_logprobs / entropy_from_logits against hand-worked softmaxes."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlhf_lit.functional import entropy_from_logits, token_logprobs

torch.set_num_threads(1)

L2, L3 = math.log(2.0), math.log(3.0)


def test_token_logprobs_picks_label_logprob():
    logits = torch.tensor(
        [
            [[0.0, L2, L3], [L3, L2, 0.0]],  # softmax: exp 1,2,3 / 6 ; exp 3,2,1 / 6
            [[5.0, 5.0, 5.0], [L3 + 7.0, 7.0, L2 + 7.0]],  # uniform ; shift-invariant 3,1,2 / 6
        ]
    )
    labels = torch.tensor([[2, 1], [0, 0]])
    expected = torch.tensor(
        [
            [math.log(3 / 6), math.log(2 / 6)],  # p(2) = 3/6 ; p(1) = 2/6
            [math.log(1 / 3), math.log(3 / 6)],  # uniform over 3 ; p(0) = 3/6
        ]
    )
    assert_close(token_logprobs(logits, labels), expected)


def test_token_logprobs_temperature():
    # logits 0, ln4, ln9: at T=1 exp gives 1, 4, 9 (sum 14); at T=2 they become 0, ln2, ln3 -> 1, 2, 3 (sum 6)
    logits = torch.tensor([[[0.0, math.log(4.0), math.log(9.0)]]])
    labels = torch.tensor([[1]])
    assert_close(token_logprobs(logits, labels), torch.tensor([[math.log(4 / 14)]]))
    assert_close(token_logprobs(logits, labels, temperature=2.0), torch.tensor([[math.log(2 / 6)]]))
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(logits, labels, temperature=0.0)


def test_token_logprobs_upcasts_bf16():
    # 0, 1, 2 are exact in bf16; log p(2) = 2 - log(1 + e + e^2). In bf16 arithmetic this would
    # be off around the 3rd digit; computed in float32 it matches at float32 tolerance.
    logits = torch.tensor([[[0.0, 1.0, 2.0]]], dtype=torch.bfloat16)
    out = token_logprobs(logits, torch.tensor([[2]]))
    assert out.dtype == torch.float32
    assert_close(out, torch.tensor([[2.0 - math.log(1.0 + math.e + math.e**2)]]))


def test_token_logprobs_gradcheck():
    logits = torch.tensor(
        [[[0.1, -0.3, 1.2, 0.5], [2.0, 0.0, -1.0, 0.3]], [[-0.7, 0.4, 0.9, -1.5], [0.2, 0.2, 0.8, 1.1]]],
        dtype=torch.float64,
        requires_grad=True,
    )
    labels = torch.tensor([[2, 0], [3, 1]])
    assert torch.autograd.gradcheck(lambda z: token_logprobs(z, labels, temperature=0.7), (logits,))


def test_entropy_uniform_is_log_v():
    # uniform over V=4 whatever the constant: H = log 4
    logits = torch.stack([torch.zeros(3, 4), torch.full((3, 4), -2.5)])  # (2, 3, 4)
    assert_close(entropy_from_logits(logits), torch.full((2, 3), math.log(4.0)))


def test_entropy_non_uniform_and_temperature():
    # p = 1/6, 2/6, 3/6: H = (1/6) ln 6 + (1/3) ln 3 + (1/2) ln 2
    h = math.log(6.0) / 6 + math.log(3.0) / 3 + math.log(2.0) / 2
    assert_close(entropy_from_logits(torch.tensor([[[0.0, L2, L3]]])), torch.tensor([[h]]))
    # 0, ln4, ln9 at temperature 2 is again 0, ln2, ln3
    logits = torch.tensor([[[0.0, math.log(4.0), math.log(9.0)]]])
    assert_close(entropy_from_logits(logits, temperature=2.0), torch.tensor([[h]]))

"""kl_penalty estimators and kl_penalized_rewards against hand-worked values."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlhf_lit.functional import kl_penalized_rewards, kl_penalty

torch.set_num_threads(1)

T, F = True, False

# logprobs - ref_logprobs = 0.5, -1.0, 0.0
LOGPROBS = torch.tensor([[-1.0, -2.0, -0.5]])
REF = torch.tensor([[-1.5, -1.0, -0.5]])


def test_k1():
    assert_close(kl_penalty(LOGPROBS, REF, "k1"), torch.tensor([[0.5, -1.0, 0.0]]))


def test_k2():
    # 0.5 * 0.5^2 = 0.125 ; 0.5 * 1^2 = 0.5
    assert_close(kl_penalty(LOGPROBS, REF, "k2"), torch.tensor([[0.125, 0.5, 0.0]]))


def test_k3():
    # r = ref - logprobs = -0.5, 1.0, 0 ; (e^r - 1) - r
    expected = torch.tensor([[math.exp(-0.5) - 1 + 0.5, math.e - 1 - 1.0, 0.0]])
    assert_close(kl_penalty(LOGPROBS, REF, "k3"), expected)


def test_abs():
    assert_close(kl_penalty(LOGPROBS, REF, "abs"), torch.tensor([[0.5, 1.0, 0.0]]))


def test_unknown_kind_names_the_allowed_ones():
    with pytest.raises(ValueError, match="k1.*k2.*k3.*abs"):
        kl_penalty(LOGPROBS, REF, "k4")  # type: ignore[arg-type]


# Row 0: response at positions 0-1 then padding (last valid 1).
# Row 1: prompt at position 0 masked out, response 1-3 (last valid 3).
# Row 2: no valid position at all -> no score anywhere.
# Masked-out logprobs hold garbage (9, 7) that must not show up.
MASK = torch.tensor([[T, T, F, F], [F, T, T, T], [F, F, F, F]])
RLP = torch.tensor([[-1.0, -2.0, 9.0, 9.0], [7.0, -0.5, -1.0, -2.0], [-1.0, -1.0, -1.0, -1.0]])
RREF = torch.tensor([[-1.5, -1.0, 0.0, 0.0], [0.0, -0.25, -1.5, -1.0], [0.0, 0.0, 0.0, 0.0]])
SCORES = torch.tensor([2.0, -3.0, 5.0])


def test_kl_penalized_rewards_k1():
    rewards, kl = kl_penalized_rewards(SCORES, RLP, RREF, MASK, kl_coef=0.1)
    # kl = logprobs - ref on valid slots: row 0: 0.5, -1 ; row 1: -0.25, 0.5, -1
    assert_close(kl, torch.tensor([[0.5, -1.0, 0.0, 0.0], [0.0, -0.25, 0.5, -1.0], [0.0, 0.0, 0.0, 0.0]]))
    # rewards = -0.1 * kl, plus the score at the last valid slot:
    # row 0: -0.05, 0.1 + 2 = 2.1 ; row 1: 0.025, -0.05, 0.1 - 3 = -2.9 ; row 2: all 0 (score 5 dropped)
    expected = torch.tensor([[-0.05, 2.1, 0.0, 0.0], [0.0, 0.025, -0.05, -2.9], [0.0, 0.0, 0.0, 0.0]])
    assert_close(rewards, expected)


def test_kl_penalized_rewards_k2_tensor_coef():
    rewards, kl = kl_penalized_rewards(SCORES, RLP, RREF, MASK, kl_coef=torch.tensor(0.5), kind="k2")
    # k2 = 0.5 * d^2: row 0: 0.125, 0.5 ; row 1: 0.03125, 0.125, 0.5
    assert_close(kl, torch.tensor([[0.125, 0.5, 0.0, 0.0], [0.0, 0.03125, 0.125, 0.5], [0.0, 0.0, 0.0, 0.0]]))
    # -0.5 * k2 (+ score): row 0: -0.0625, -0.25 + 2 = 1.75 ; row 1: -0.015625, -0.0625, -0.25 - 3 = -3.25
    expected = torch.tensor([[-0.0625, 1.75, 0.0, 0.0], [0.0, -0.015625, -0.0625, -3.25], [0.0, 0.0, 0.0, 0.0]])
    assert_close(rewards, expected)

"""DPO-family losses, sequence logprobs and response masks against hand-worked values."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlhf_lit.functional import averages_over_tokens, dpo_loss, response_mask_from_prompt_length, sequence_logprobs
from rlhf_lit.functional.dpo import ipo_loss, sigmoid_dpo_loss

torch.set_num_threads(1)

# ---------------------------------------------------------------- two pairs, beta = 0.5
# pair 1: policy chosen -1, rejected -3; reference chosen -2, rejected -2
#         log ratios: chosen -1 - (-2) = +1, rejected -3 - (-2) = -1  ->  h = 1 - (-1) = 2, beta h = 1
# pair 2: policy chosen -2, rejected -1; reference chosen -1, rejected -1
#         log ratios: chosen -1, rejected 0                           ->  h = -1,         beta h = -0.5
LOGPS_C = torch.tensor([-1.0, -2.0])
LOGPS_R = torch.tensor([-3.0, -1.0])
REF_C = torch.tensor([-2.0, -1.0])
REF_R = torch.tensor([-2.0, -1.0])
BETA = 0.5
# softplus(x) = log(1 + e^x) = -log sigmoid(-x); softplus(x) - softplus(-x) = x.
SOFTPLUS_MINUS_1 = 0.31326168751822286  # log(1 + e^-1) = -log sigmoid(1)
SOFTPLUS_HALF = 0.9740769841801067  # log(1 + e^0.5) = -log sigmoid(-0.5)


def test_constants_are_what_the_comments_say():
    # The two literals above, from their definitions (not from the code under test).
    assert SOFTPLUS_MINUS_1 == pytest.approx(math.log(1 + math.exp(-1)), rel=1e-15)
    assert SOFTPLUS_HALF == pytest.approx(math.log(1 + math.exp(0.5)), rel=1e-15)


def test_sigmoid_dpo_loss_by_hand():
    loss, stats = dpo_loss(LOGPS_C, LOGPS_R, REF_C, REF_R, BETA, "sigmoid")
    # pair 1: -log sigmoid(1) = 0.31326..., pair 2: -log sigmoid(-0.5) = 0.97408...; mean:
    assert_close(loss, torch.tensor((0.31326168751822286 + 0.9740769841801067) / 2))  # 0.64366933584916478
    # implicit rewards beta * log ratio: chosen (0.5, -0.5), rejected (-0.5, 0)
    assert_close(stats["rewards_chosen"], torch.tensor(0.0))
    assert_close(stats["rewards_rejected"], torch.tensor(-0.25))
    assert_close(stats["reward_accuracy"], torch.tensor(0.5))  # pair 1 wins (0.5 > -0.5), pair 2 loses (-0.5 < 0)
    assert_close(stats["reward_margin"], torch.tensor(0.25))  # (1 + (-0.5)) / 2
    assert_close(stats["implicit_kl"], torch.tensor(-0.25))  # log ratios (1, -1, -1, 0) / 4
    assert all(not v.requires_grad and v.dim() == 0 for v in stats.values())


def test_conservative_dpo_label_smoothing_by_hand():
    eps = 0.25
    loss, _ = dpo_loss(LOGPS_C, LOGPS_R, REF_C, REF_R, BETA, "sigmoid", label_smoothing=eps)
    # per pair (1 - eps) softplus(-bh) + eps softplus(bh) = softplus(-bh) + eps * bh:
    #   pair 1 (bh = 1):    0.31326168751822286 + 0.25 * 1    = 0.56326168751822286
    #   pair 2 (bh = -0.5): 0.9740769841801067 + 0.25 * -0.5  = 0.8490769841801067
    assert_close(loss, torch.tensor((0.56326168751822286 + 0.8490769841801067) / 2))  # 0.7061693358491648
    # eps = 0 is plain DPO; eps only moves the loss (its per-pair form is checked here too)
    assert_close(
        sigmoid_dpo_loss(torch.tensor([2.0, -1.0]), BETA, eps), torch.tensor([0.56326168751822286, 0.8490769841801067])
    )


def test_ipo_loss_by_hand():
    loss, stats = dpo_loss(LOGPS_C, LOGPS_R, REF_C, REF_R, BETA, "ipo")
    # target 1 / (2 * 0.5) = 1: pair 1 (2 - 1)^2 = 1, pair 2 (-1 - 1)^2 = 4; mean 2.5
    assert_close(loss, torch.tensor(2.5))
    assert_close(ipo_loss(torch.tensor([2.0, -1.0]), BETA), torch.tensor([1.0, 4.0]))
    assert_close(stats["reward_margin"], torch.tensor(0.25))  # the statistics do not depend on the kind


def test_beta_scales_the_sigmoid_loss():
    # beta = 1: pair 1 bh = 2, pair 2 bh = -1; -log sigmoid(2) = log(1 + e^-2) = 0.12692801104297252,
    # -log sigmoid(-1) = log(1 + e) = 1.3132616875182228
    loss, stats = dpo_loss(LOGPS_C, LOGPS_R, REF_C, REF_R, 1.0, "sigmoid")
    assert_close(loss, torch.tensor((0.12692801104297252 + 1.3132616875182228) / 2))
    assert_close(stats["rewards_chosen"], torch.tensor(0.0))  # (1 + -1) / 2


def test_swapping_chosen_and_rejected_changes_the_loss():
    # A sign flip of h in the code would give exactly this (pair 1 -> softplus(1), pair 2 -> softplus(-0.5)).
    loss, _ = dpo_loss(LOGPS_R, LOGPS_C, REF_R, REF_C, BETA, "sigmoid")
    assert_close(loss, torch.tensor((1.3132616875182228 + 0.47407698418010669) / 2))
    right, _ = dpo_loss(LOGPS_C, LOGPS_R, REF_C, REF_R, BETA, "sigmoid")
    assert float(loss) > float(right) + 0.1


def test_reference_equal_to_policy_gives_log_2():
    # h = 0 for every pair: -log sigmoid(0) = log 2, for any beta; no gradient towards either side
    logps = torch.tensor([-4.0, -7.5, -1.0], requires_grad=True)
    other = torch.tensor([-3.0, -2.0, -9.0])
    loss, stats = dpo_loss(logps, other, logps.detach(), other, 0.1)
    assert_close(loss, torch.tensor(math.log(2)))
    assert_close(stats["reward_accuracy"], torch.tensor(0.0))  # ties count as wrong
    loss.backward()
    # d/dx -log sigmoid(beta (x - c)) = -beta sigmoid(-beta h) = -0.1 * 0.5 per pair, / 3 for the mean
    assert_close(logps.grad, torch.full((3,), -0.05 / 3))


@pytest.mark.parametrize("kind,eps", [("sigmoid", 0.0), ("sigmoid", 0.2), ("ipo", 0.0)])
def test_dpo_loss_gradcheck(kind, eps):
    torch.manual_seed(0)
    d = dict(dtype=torch.float64)
    chosen = (torch.randn(4, **d) - 3).requires_grad_()
    rejected = (torch.randn(4, **d) - 3).requires_grad_()
    ref_c, ref_r = torch.randn(4, **d) - 3, torch.randn(4, **d) - 3
    assert torch.autograd.gradcheck(lambda c, r: dpo_loss(c, r, ref_c, ref_r, 0.3, kind, eps)[0], (chosen, rejected))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(beta=0.0), "beta must be > 0"),
        (dict(beta=-1.0), "beta must be > 0"),
        (dict(beta=float("inf")), "beta must be a finite number, got inf"),
        (dict(label_smoothing=0.5), r"label_smoothing must be in \[0, 0.5\)"),
        (dict(label_smoothing=-0.1), r"label_smoothing must be in \[0, 0.5\)"),
        (dict(kind="ipo", label_smoothing=0.1), "applies to loss='sigmoid'"),
        (dict(kind="hinge"), "loss must be one of sigmoid, ipo"),
    ],
)
def test_bad_settings_name_the_option(kwargs, message):
    args = dict(beta=0.1, kind="sigmoid", label_smoothing=0.0) | kwargs
    with pytest.raises(ValueError, match=message):
        dpo_loss(LOGPS_C, LOGPS_R, REF_C, REF_R, **args)


def test_which_kinds_average_over_tokens():
    assert averages_over_tokens("sigmoid") is False
    assert averages_over_tokens("ipo") is True


# ---------------------------------------------------------------- response masks
def test_response_mask_from_prompt_length_right_and_left_padding():
    # row 0: 5 real tokens, prompt 2 -> response at real indices 2, 3, 4
    # row 1: 3 real tokens, prompt 1 -> response at real indices 1, 2
    right = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    left = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    lengths = torch.tensor([2, 1])
    T, F = True, False
    assert response_mask_from_prompt_length(right, lengths).tolist() == [[F, F, T, T, T], [F, T, T, F, F]]
    assert response_mask_from_prompt_length(left, lengths).tolist() == [[F, F, T, T, T], [F, F, F, T, T]]


# ---------------------------------------------------------------- sequence logprobs
# Vocabulary of 4; logits are log-probabilities, so log_softmax gives them back exactly.
# One sequence: prompt [3] (BOS-like), response [1, 2]. Position t predicts token t + 1:
#   position 0: P = (1/8, 1/2, 1/8, 1/4)    -> response token 1: 1/2  (counts)
#   position 1: P = (9/16, 1/16, 1/4, 1/8)  -> response token 2: 1/4  (counts)
#   position 2: P = (1/4, 1/4, 1/4, 1/4)    -> predicts past the sequence: never counts
# Expected: log(1/2) + log(1/4) = -3 log 2; the token mean -1.5 log 2.
# The off-by-ones read other numbers: logits not shifted (position t scoring token t, over the
# response positions 1, 2) log P1(1) + log P2(2) = log 1/16 + log 1/4 = -6 log 2; the mask not shifted
# with the labels (mask[:, :-1] = [F, T]) only log P1(2) = -2 log 2; in the padded rows below, a
# mask one position too late would also read a pad position's garbage logits.
LOG2 = 0.6931471805599453
SEQ_PROBS = [[0.125, 0.5, 0.125, 0.25], [0.5625, 0.0625, 0.25, 0.125], [0.25, 0.25, 0.25, 0.25]]
GARBAGE = [[1e4, -1e4, 3.0, 7.0]]  # logits at pad positions: any values


def _logits(probs_by_position: list[list[float]]) -> torch.Tensor:
    return torch.tensor(probs_by_position).log()  # (T, V)


def test_sequence_logprobs_right_and_left_padding():
    ids_right = torch.tensor([[3, 1, 2, 0, 0]])
    ids_left = torch.tensor([[0, 0, 3, 1, 2]])
    real = _logits(SEQ_PROBS)  # (3, V)
    junk = torch.tensor(GARBAGE * 2)  # (2, V)
    logits_right = torch.cat([real, junk]).unsqueeze(0)  # (1, 5, V)
    logits_left = torch.cat([junk, real]).unsqueeze(0)  # (1, 5, V)
    mask_right = torch.tensor([[False, True, True, False, False]])
    mask_left = torch.tensor([[False, False, False, True, True]])
    expected_sum = torch.tensor([-3 * LOG2])  # log 1/2 + log 1/4
    assert_close(sequence_logprobs(logits_right, ids_right, mask_right), expected_sum)
    assert_close(sequence_logprobs(logits_left, ids_left, mask_left), expected_sum)
    assert_close(sequence_logprobs(logits_right, ids_right, mask_right, average=True), torch.tensor([-1.5 * LOG2]))
    assert_close(sequence_logprobs(logits_left, ids_left, mask_left, average=True), torch.tensor([-1.5 * LOG2]))


def test_sequence_logprobs_batch_and_gradients_reach_response_positions_only():
    torch.manual_seed(0)
    logits = torch.randn(2, 6, 5, dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([[4, 1, 2, 3, 0, 0], [0, 4, 4, 1, 2, 3]])
    mask = response_mask_from_prompt_length(
        torch.tensor([[1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1]]), torch.tensor([2, 3])
    )
    sequence_logprobs(logits, ids, mask).sum().backward()
    touched = logits.grad.abs().sum(-1) > 0  # (2, 6) positions whose logits got a gradient
    # row 0: response tokens at 2, 3 -> scored by logits 1, 2; row 1: response at 4, 5 -> logits 3, 4
    assert touched.tolist() == [[False, True, True, False, False, False], [False, False, False, True, True, False]]
    assert torch.autograd.gradcheck(
        lambda x: sequence_logprobs(x, ids, mask, average=True), (logits.detach().requires_grad_(),)
    )

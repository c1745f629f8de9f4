"""PPO policy / value losses, Bradley-Terry loss and SFT loss against hand-worked values."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlhf_lit.functional import clipped_value_loss, pairwise_reward_loss, ppo_policy_loss, sft_loss

torch.set_num_threads(1)

T, F = True, False

# ---------------------------------------------------------------- ppo_policy_loss (eps = 0.2)
# log ratio / advantage per token; row 1 slot 2 is masked out and holds garbage.
#   a: log r = 0.5  (r = e^.5 ~ 1.65 > 1.2), A = +1 : max(-e^.5, -1.2) = -1.2          clipped active
#   b: log r = 0.5,                          A = -2 : max(2e^.5, 2.4) = 2e^.5           unclipped
#   e: log r = 0.1  (r inside [0.8, 1.2]),   A = .5 : both -0.5e^.1                     not clipped (tie)
#   c: log r = -0.5 (r = e^-.5 ~ 0.61 < 0.8), A = +1 : max(-e^-.5, -0.8) = -e^-.5        unclipped
#   d: log r = -0.5,                          A = -2 : max(2e^-.5, 1.6) = 1.6           clipped active
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -1.0, -2.0]])
NEW = torch.tensor([[-0.5, -1.5, -0.4], [-2.0, -1.5, 1.0]])  # OLD + log ratios 0.5, 0.5, 0.1 / -0.5, -0.5, 3
ADV = torch.tensor([[1.0, -2.0, 0.5], [1.0, -2.0, 100.0]])
MASK = torch.tensor([[T, T, T], [T, T, F]])


def test_ppo_policy_loss_clipping_both_signs():
    loss, stats = ppo_policy_loss(NEW, OLD, ADV, MASK, clip_range=0.2)
    # mean of a, b, e, c, d
    expected = (-1.2 + 2 * math.exp(0.5) - 0.5 * math.exp(0.1) - math.exp(-0.5) + 1.6) / 5
    assert_close(loss, torch.tensor(expected))
    assert_close(stats["clipfrac"], torch.tensor(2 / 5))  # a and d
    # (r - 1) - log r per token
    kl = (2 * (math.exp(0.5) - 1 - 0.5) + (math.exp(0.1) - 1 - 0.1) + 2 * (math.exp(-0.5) - 1 + 0.5)) / 5
    assert_close(stats["approx_kl"], torch.tensor(kl))
    assert_close(stats["ratio_mean"], torch.tensor((2 * math.exp(0.5) + math.exp(0.1) + 2 * math.exp(-0.5)) / 5))
    assert all(not v.requires_grad and v.dim() == 0 for v in stats.values())


def test_ppo_policy_loss_ratio_one_is_minus_mean_advantage():
    logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, 5.0, -0.7]])
    adv = torch.tensor([[1.0, -3.0, 0.5], [2.0, 100.0, -0.5]])
    mask = torch.tensor([[T, T, T], [T, F, T]])
    loss, stats = ppo_policy_loss(logprobs, logprobs.clone(), adv, mask, clip_range=0.2)
    # -(1 - 3 + 0.5 + 2 - 0.5) / 5 = 0
    assert_close(loss, torch.tensor(0.0))
    mask2 = torch.tensor([[T, T, T], [T, F, F]])
    loss, stats = ppo_policy_loss(logprobs, logprobs.clone(), adv, mask2, clip_range=0.2)
    # -(1 - 3 + 0.5 + 2) / 4 = -0.125
    assert_close(loss, torch.tensor(-0.125))
    assert_close(stats["clipfrac"], torch.tensor(0.0))
    assert_close(stats["approx_kl"], torch.tensor(0.0))
    assert_close(stats["ratio_mean"], torch.tensor(1.0))
    assert_close(stats["ratio_var"], torch.tensor(0.0))


def test_ppo_policy_loss_ratio_var():
    # ratios 1, 2, 3 (log 0, ln2, ln3): mean 2, population variance (1 + 0 + 1) / 3
    old = torch.zeros(1, 4)
    new = torch.tensor([[0.0, math.log(2.0), math.log(3.0), 4.0]])
    _, stats = ppo_policy_loss(new, old, torch.ones(1, 4), torch.tensor([[T, T, T, F]]), clip_range=10.0)
    assert_close(stats["ratio_mean"], torch.tensor(2.0))
    assert_close(stats["ratio_var"], torch.tensor(2.0 / 3.0))


def test_ppo_policy_loss_gradcheck():
    old = torch.zeros(2, 3, dtype=torch.float64)
    # log ratios away from the kinks at log 0.8 and log 1.2: inside, above and below the range
    new = torch.tensor([[0.05, 0.5, -0.5], [-0.05, 0.4, 0.1]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, -2.0, 1.5], [-0.5, 0.7, 2.0]], dtype=torch.float64)
    mask = torch.tensor([[T, T, T], [T, T, F]])
    assert torch.autograd.gradcheck(lambda lp: ppo_policy_loss(lp, old, adv, mask, 0.2)[0], (new,))


def test_ppo_policy_loss_rejects_bad_clip_range():
    with pytest.raises(ValueError, match="clip_range"):
        ppo_policy_loss(NEW, OLD, ADV, MASK, clip_range=0.0)


# ---------------------------------------------------------------- clipped_value_loss (eps = 0.2)
#   a: v=1,  old=0.5, R=2 : v_clip=0.7,  err=1, err_clip=1.69 -> 1.69   clipped active
#   b: v=1,  old=0.5, R=0 : v_clip=0.7,  err=1, err_clip=0.49 -> 1
#   c: v=.6, old=0.5, R=2 : v_clip=0.6 (inside), both 1.96    -> 1.96   tie, not clipped
#   d: v=-1, old=0,   R=1 : v_clip=-0.2, err=4, err_clip=1.44 -> 4
#   e: v=-1, old=0,   R=-3: v_clip=-0.2, err=4, err_clip=7.84 -> 7.84   clipped active
V = torch.tensor([[1.0, 1.0, 0.6], [-1.0, -1.0, 50.0]])
V_OLD = torch.tensor([[0.5, 0.5, 0.5], [0.0, 0.0, -50.0]])
RET = torch.tensor([[2.0, 0.0, 2.0], [1.0, -3.0, 9.0]])


def test_clipped_value_loss():
    loss, stats = clipped_value_loss(V, V_OLD, RET, MASK, clip_range=0.2)
    # 0.5 * (1.69 + 1 + 1.96 + 4 + 7.84) / 5 = 0.5 * 16.49 / 5 = 1.649
    assert_close(loss, torch.tensor(1.649))
    assert_close(stats["clipfrac"], torch.tensor(2 / 5))  # a and e


def test_clipped_value_loss_unclipped_is_half_mse():
    # values == old_values: no clipping; 0.5 * ((1-2)^2 + (1-0)^2 + (0.6-2)^2 + (-1-1)^2 + (-1+3)^2) / 5
    loss, stats = clipped_value_loss(V, V.clone(), RET, MASK, clip_range=0.2)
    assert_close(loss, torch.tensor(0.5 * (1 + 1 + 1.96 + 4 + 4) / 5))
    assert_close(stats["clipfrac"], torch.tensor(0.0))


def test_clipped_value_loss_gradcheck():
    old = torch.zeros(2, 3, dtype=torch.float64)
    # |v - old| away from eps = 0.2, and errors not tied
    values = torch.tensor([[0.5, -0.5, 0.1], [0.05, 0.9, -0.3]], dtype=torch.float64, requires_grad=True)
    returns = torch.tensor([[2.0, 1.0, -1.0], [0.5, -1.0, 0.7]], dtype=torch.float64)
    mask = torch.tensor([[T, T, T], [T, T, F]])
    assert torch.autograd.gradcheck(lambda v: clipped_value_loss(v, old, returns, mask, 0.2)[0], (values,))


# ---------------------------------------------------------------- pairwise_reward_loss
CHOSEN = torch.tensor([2.0, 0.0, -1.0])
REJECTED = torch.tensor([1.0, 0.0, 1.0])  # differences 1, 0 (tie), -2


def test_pairwise_reward_loss():
    loss, accuracy = pairwise_reward_loss(CHOSEN, REJECTED)
    # -log sigmoid(x) = log(1 + e^-x) for x = 1, 0, -2
    expected = (math.log(1 + math.exp(-1)) + math.log(2.0) + math.log(1 + math.exp(2))) / 3
    assert_close(loss, torch.tensor(expected))
    assert_close(accuracy, torch.tensor(1 / 3))  # only the first pair; the tie counts as wrong


def test_pairwise_reward_loss_margin():
    loss, accuracy = pairwise_reward_loss(CHOSEN, REJECTED, margin=torch.tensor([0.5, -1.0, 1.0]))
    # x = diff - margin = 0.5, 1, -3
    expected = (math.log(1 + math.exp(-0.5)) + math.log(1 + math.exp(-1)) + math.log(1 + math.exp(3))) / 3
    assert_close(loss, torch.tensor(expected))
    assert_close(accuracy, torch.tensor(1 / 3))  # accuracy ignores the margin


def test_pairwise_reward_loss_gradcheck():
    chosen = torch.tensor([0.3, -1.0, 2.0], dtype=torch.float64, requires_grad=True)
    rejected = torch.tensor([0.1, 0.5, -0.7], dtype=torch.float64, requires_grad=True)
    margin = torch.tensor([0.2, 0.0, 1.0], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda c, r: pairwise_reward_loss(c, r, margin)[0], (chosen, rejected))
    _, accuracy = pairwise_reward_loss(chosen, rejected)
    assert not accuracy.requires_grad


# ---------------------------------------------------------------- sft_loss
L2, L3 = math.log(2.0), math.log(3.0)


def test_sft_loss_shift_and_ignore_index():
    logits = torch.tensor(
        [
            [[0.0, L2, L3], [L3, L2, 0.0], [50.0, -50.0, 0.0]],  # last slot predicts nothing
            [[0.0, 0.0, 0.0], [50.0, -50.0, 0.0], [-50.0, 50.0, 0.0]],
        ]
    )
    labels = torch.tensor([[-100, 2, 1], [1, 0, -100]])
    # logits[0,0] -> label 2: p = 3/6, CE ln 2 ; logits[0,1] -> label 1: p = 2/6, CE ln 3
    # logits[1,0] -> label 0: uniform, CE ln 3 ; logits[1,1] -> -100 ignored
    assert_close(sft_loss(logits, labels), torch.tensor((L2 + L3 + L3) / 3))


def test_sft_loss_custom_ignore_index_and_empty():
    logits = torch.zeros(1, 3, 4)
    # uniform over 4: CE ln 4 at the one counted slot
    assert_close(sft_loss(logits, torch.tensor([[-1, 2, -1]]), ignore_index=-1), torch.tensor(math.log(4.0)))
    # Only the first label counts, and nothing predicts it: no label after the shift -> NaN
    # (no raising check: that would be a host sync on every call).
    assert torch.isnan(sft_loss(logits, torch.tensor([[3, -100, -100]])))


def test_sft_loss_gradcheck():
    logits = torch.tensor(
        [[[0.1, -0.3, 1.2], [2.0, 0.0, -1.0], [0.4, 0.4, 0.0]], [[-0.7, 0.4, 0.9], [0.2, 0.8, 1.1], [1.0, 0.0, 0.5]]],
        dtype=torch.float64,
        requires_grad=True,
    )
    labels = torch.tensor([[-100, 2, 0], [1, 1, -100]])
    assert torch.autograd.gradcheck(lambda z: sft_loss(z, labels), (logits,))

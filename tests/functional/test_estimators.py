"""Critic-free estimators (GRPO, Dr. GRPO, RLOO, REINFORCE++) and the KL loss, by hand.

The batch holds two groups of k = 3 consecutive rows, so a wrong grouping (rows interleaved,
groups of 2) gives other numbers; the masks have different lengths, left offsets and one empty
row, so an advantage broadcast onto padding or prompt shows up as a nonzero where 0 is expected.
"""

import math
import random
import statistics

import pytest
import torch
from torch.testing import assert_close

from rlhf_lit.functional import (
    grpo_advantages,
    kl_loss,
    needs_critic,
    needs_groups,
    reinforce_pp_advantages,
    rloo_advantages,
)

torch.set_num_threads(1)

T, F = True, False
NAN = float("nan")

# Group A = rows 0-2, scores [1, 2, 4]; group B = rows 3-5, scores [0, 3, 6].
SCORES = torch.tensor([1.0, 2.0, 4.0, 0.0, 3.0, 6.0])
MASK = torch.tensor(
    [
        [T, T, T, F, F],  # 3 tokens, right padding
        [F, T, T, T, T],  # prompt offset 1, 4 tokens
        [F, F, T, F, F],  # offset 2, a single token
        [T, T, T, T, T],  # the full width
        [F, T, T, F, F],  # offset 1, 2 tokens
        [F, F, F, F, F],  # empty: its (nonzero) advantage must land nowhere
    ]
)


def _on_tokens(per_row: list[float]) -> torch.Tensor:
    """Put one number per row on that row's True positions of MASK (written out, no estimator)."""
    return torch.tensor([[v if m else 0.0 for m in row] for v, row in zip(per_row, MASK.tolist())])


# GRPO, unbiased std, eps = 0 (exact numbers):
#   A: mean 7/3; deviations -4/3, -1/3, 5/3; var = (16/9 + 1/9 + 25/9) / (3 - 1) = 7/3;
#      std = sqrt(7/3) = 1.52752523; advantages -4/3 / 1.52752523 = -0.87287156,
#      -1/3 / 1.52752523 = -0.21821789, 5/3 / 1.52752523 = 1.09108945
#   B: mean 3; deviations -3, 0, 3; var = (9 + 0 + 9) / 2 = 9; std 3; advantages -1, 0, 1
#   (the population std would give sqrt(14/9) = 1.24721913 and sqrt(6) = 2.44948974 instead)
GRPO_ROWS = [-0.87287156, -0.21821789, 1.09108945, -1.0, 0.0, 1.0]
# Default eps = 1e-4: group B becomes -3 / (3 + 1e-4) = -0.99996667, 0, 0.99996667
GRPO_EPS_ROWS_B = [-0.99996667, 0.0, 0.99996667]
# Dr. GRPO (no std division): the deviations themselves.
DR_GRPO_ROWS = [-4 / 3, -1 / 3, 5 / 3, -3.0, 0.0, 3.0]
# RLOO: score minus the mean of the other two of its group.
#   A: 1 - (2 + 4)/2 = -2 ; 2 - (1 + 4)/2 = -0.5 ; 4 - (1 + 2)/2 = 2.5
#   B: 0 - (3 + 6)/2 = -4.5 ; 3 - (0 + 6)/2 = 0 ; 6 - (0 + 3)/2 = 4.5
RLOO_ROWS = [-2.0, -0.5, 2.5, -4.5, 0.0, 4.5]


def test_grpo_hand_worked_groups():
    advantages, returns = grpo_advantages(SCORES, MASK, k=3, eps=0.0)
    assert_close(advantages, _on_tokens(GRPO_ROWS))
    assert_close(returns, advantages)


def test_grpo_default_eps_is_added_to_the_std():
    advantages, _ = grpo_advantages(SCORES, MASK, k=3)
    assert_close(advantages[3:], _on_tokens(GRPO_ROWS[:3] + GRPO_EPS_ROWS_B)[3:])
    # Row 5 is empty: 0.99996667 must not appear anywhere in it.
    assert_close(advantages[5], torch.zeros(5))


def test_dr_grpo_hand_worked_groups():
    advantages, returns = grpo_advantages(SCORES, MASK, k=3, scale_by_std=False)
    assert_close(advantages, _on_tokens(DR_GRPO_ROWS))
    assert_close(returns, advantages)


def test_rloo_hand_worked_groups():
    advantages, returns = rloo_advantages(SCORES, MASK, k=3)
    assert_close(advantages, _on_tokens(RLOO_ROWS))
    assert_close(returns, advantages)


def test_group_of_two_rloo_and_grpo():
    # k = 2 on the same six scores: groups [1, 2], [4, 0], [3, 6].
    # RLOO: each minus the other: -1, 1 ; 4, -4 ; -3, 3
    advantages, _ = rloo_advantages(SCORES, MASK, k=2)
    assert_close(advantages, _on_tokens([-1.0, 1.0, 4.0, -4.0, -3.0, 3.0]))
    # GRPO: unbiased std of a pair = |a - b| / sqrt(2); (a - mean) / std = +-1/sqrt(2) = +-0.70710678
    advantages, _ = grpo_advantages(SCORES, MASK, k=2, eps=0.0)
    h = 0.70710678
    assert_close(advantages, _on_tokens([-h, h, h, -h, -h, h]))


@pytest.mark.parametrize("value", [0.1, -3.7, 1e6])
def test_equal_scores_give_exact_zero_not_nan(value):
    # Group A all equal (mean of three 0.1 in float32 is not exactly 0.1: the rounding residue
    # must not be divided by std + eps); group B still gets its usual advantages.
    scores = torch.tensor([value, value, value, 0.0, 3.0, 6.0])
    for advantages, _ in (
        grpo_advantages(scores, MASK, k=3),
        grpo_advantages(scores, MASK, k=3, scale_by_std=False),
        rloo_advantages(scores, MASK, k=3),
    ):
        assert not advantages.isnan().any()
        assert_close(advantages[:3], torch.zeros(3, 5), rtol=0, atol=0)
    advantages, _ = grpo_advantages(scores, MASK, k=3, eps=0.0)
    assert_close(advantages[3:], _on_tokens(GRPO_ROWS)[3:])


@pytest.mark.parametrize("fn", [grpo_advantages, rloo_advantages])
def test_batch_not_a_multiple_of_k_is_refused(fn):
    with pytest.raises(ValueError, match="not a multiple of k=4"):
        fn(SCORES, MASK, k=4)


@pytest.mark.parametrize("fn", [grpo_advantages, rloo_advantages])
@pytest.mark.parametrize("k", [1, 0, -3, True, 3.0])
def test_k_must_be_an_int_of_at_least_two(fn, k):
    with pytest.raises(ValueError, match="k .* must be an int >= 2"):
        fn(SCORES, MASK, k=k)


@pytest.mark.parametrize("fn", [grpo_advantages, rloo_advantages])
def test_group_estimators_check_shapes_and_mask_dtype(fn):
    with pytest.raises(ValueError, match=r"scores must be \(B,\)"):
        fn(SCORES.unsqueeze(-1), MASK, k=3)
    with pytest.raises(ValueError, match=r"mask must be \(B, T\)"):
        fn(SCORES, MASK[:3], k=3)
    with pytest.raises(ValueError, match="bool"):
        fn(SCORES, MASK.float(), k=3)


# REINFORCE++, gamma = 1, two rows, garbage (NaN) in the masked slots:
#   row 0: mask T T T F, rewards 0, -1, 2 -> returns-to-go t2 = 2, t1 = -1 + 2 = 1, t0 = 0 + 1 = 1
#   row 1: mask F T T T, rewards 2, 0, -2 -> t3 = -2, t2 = 0 - 2 = -2, t1 = 2 - 2 = 0
#   valid returns 1, 1, 2, 0, -2, -2: mean 0; unbiased var (1 + 1 + 4 + 0 + 4 + 4) / 5 = 2.8
#   advantages = returns / sqrt(2.8 + 1e-8) = returns * 0.59761430: 1 -> 0.59761430, 2 -> 1.19522861
PP_REWARDS = torch.tensor([[0.0, -1.0, 2.0, NAN], [NAN, 2.0, 0.0, -2.0]])
PP_MASK = torch.tensor([[T, T, T, F], [F, T, T, T]])
PP_RETURNS = torch.tensor([[1.0, 1.0, 2.0, 0.0], [0.0, 0.0, -2.0, -2.0]])
PP_ADV = torch.tensor([[0.59761430, 0.59761430, 1.19522861, 0.0], [0.0, 0.0, -1.19522861, -1.19522861]])


def test_reinforce_pp_hand_worked_rows():
    advantages, returns = reinforce_pp_advantages(PP_REWARDS, PP_MASK)
    assert_close(returns, PP_RETURNS)
    assert_close(advantages, PP_ADV)


def test_reinforce_pp_discount():
    # gamma = 0.5: row 0: t2 = 2, t1 = -1 + 0.5*2 = 0, t0 = 0 + 0.5*0 = 0
    #              row 1: t3 = -2, t2 = 0 + 0.5*(-2) = -1, t1 = 2 + 0.5*(-1) = 1.5
    _, returns = reinforce_pp_advantages(PP_REWARDS, PP_MASK, gamma=0.5)
    assert_close(returns, torch.tensor([[0.0, 0.0, 2.0, 0.0], [0.0, 1.5, -1.0, -2.0]]))


def test_reinforce_pp_skips_gaps_and_padding():
    # Row 0 above with a masked gap (garbage 1e6) between its tokens and garbage behind it: the
    # returns of its valid tokens are unchanged (1, 1, 2), the gap holds 0.
    rewards = torch.tensor([[0.0, 1e6, -1.0, 2.0, NAN], [NAN, 2.0, 0.0, -2.0, 5e5]])
    mask = torch.tensor([[T, F, T, T, F], [F, T, T, T, F]])
    advantages, returns = reinforce_pp_advantages(rewards, mask)
    assert_close(returns, torch.tensor([[1.0, 0.0, 1.0, 2.0, 0.0], [0.0, 0.0, -2.0, -2.0, 0.0]]))
    a, b = 0.59761430, 1.19522861
    assert_close(advantages, torch.tensor([[a, 0.0, a, b, 0.0], [0.0, 0.0, -b, -b, 0.0]]))


def test_reinforce_pp_equal_returns_give_zero_not_nan():
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])  # every return-to-go is 1
    mask = torch.tensor([[T, T, F], [F, F, T]])
    advantages, returns = reinforce_pp_advantages(rewards, mask)
    assert_close(returns, torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]]))
    assert_close(advantages, torch.zeros(2, 3))


def test_reinforce_pp_checks_shapes():
    with pytest.raises(ValueError, match=r"both be \(B, T\)"):
        reinforce_pp_advantages(PP_REWARDS, PP_MASK[:, :3])
    with pytest.raises(ValueError, match="bool"):
        reinforce_pp_advantages(PP_REWARDS, PP_MASK.long())
    with pytest.raises(ValueError, match="at least 2"):
        reinforce_pp_advantages(PP_REWARDS, torch.tensor([[F, F, T, F], [F, F, F, F]]))


# --- an independent plain-loop re-implementation, on random batches --------------------------


def _loop_group(scores: list[float], k: int, kind: str) -> list[float]:
    out = []
    for g in range(len(scores) // k):
        group = scores[g * k : (g + 1) * k]
        mean = sum(group) / k
        for s in group:
            if max(group) == min(group):
                out.append(0.0)
            elif kind == "grpo":
                out.append((s - mean) / (statistics.stdev(group) + 1e-4))  # stdev: n - 1
            elif kind == "dr_grpo":
                out.append(s - mean)
            else:  # rloo
                out.append(s - (sum(group) - s) / (k - 1))
    return out


def _loop_reinforce_pp(rewards: list[list[float]], mask: list[list[bool]], gamma: float):
    returns = [[0.0] * len(row) for row in rewards]
    for i, row in enumerate(rewards):
        running = 0.0
        for t in reversed(range(len(row))):
            if mask[i][t]:
                running = row[t] + gamma * running
                returns[i][t] = running
    valid = [returns[i][t] for i in range(len(mask)) for t in range(len(mask[i])) if mask[i][t]]
    mean, std = statistics.mean(valid), math.sqrt(statistics.variance(valid) + 1e-8)
    advantages = [
        [(returns[i][t] - mean) / std if mask[i][t] else 0.0 for t in range(len(mask[i]))] for i in range(len(mask))
    ]
    return advantages, returns


def _random_mask(rng: random.Random, batch: int, length: int) -> torch.Tensor:
    rows = []
    for _ in range(batch):
        start = rng.randrange(length)
        stop = rng.randrange(start, length + 1)
        rows.append([start <= t < stop for t in range(length)])
    return torch.tensor(rows)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("kind", ["grpo", "dr_grpo", "rloo"])
def test_group_estimators_match_plain_loops(seed, kind):
    rng = random.Random(seed)
    k, groups, length = rng.choice([2, 3, 4, 8]), rng.randint(1, 4), rng.randint(1, 7)
    scores = torch.tensor([rng.uniform(-3, 3) for _ in range(k * groups)])
    if groups > 1:
        scores[:k] = 0.5  # one flat group in most batches
    mask = _random_mask(rng, k * groups, length)
    if kind == "rloo":
        advantages, _ = rloo_advantages(scores, mask, k)
    else:
        advantages, _ = grpo_advantages(scores, mask, k, scale_by_std=kind == "grpo")
    per_row = _loop_group(scores.double().tolist(), k, kind)
    expected = torch.tensor(
        [[v if m else 0.0 for m in row] for v, row in zip(per_row, mask.tolist())], dtype=torch.float32
    )
    assert_close(advantages, expected)


@pytest.mark.parametrize("seed", range(5))
def test_reinforce_pp_matches_plain_loops(seed):
    rng = random.Random(seed)
    batch, length, gamma = rng.randint(2, 6), rng.randint(2, 7), rng.choice([1.0, 0.9, 0.5])
    mask = _random_mask(rng, batch, length)
    mask[0, :2] = True  # at least 2 valid tokens
    rewards = torch.tensor([[rng.uniform(-2, 2) for _ in range(length)] for _ in range(batch)])
    advantages, returns = reinforce_pp_advantages(rewards, mask, gamma)
    loop_adv, loop_ret = _loop_reinforce_pp(rewards.double().tolist(), mask.tolist(), gamma)
    assert_close(returns, torch.tensor(loop_ret, dtype=torch.float32))
    assert_close(advantages, torch.tensor(loop_adv, dtype=torch.float32))


# --- the typed choice -------------------------------------------------------------------------


def test_estimator_kind_helpers():
    assert [needs_critic(k) for k in ("gae", "grpo", "dr_grpo", "rloo", "reinforce_pp")] == [T, F, F, F, F]
    assert [needs_groups(k) for k in ("gae", "grpo", "dr_grpo", "rloo", "reinforce_pp")] == [F, T, T, T, F]
    for helper in (needs_critic, needs_groups):
        with pytest.raises(ValueError, match="gae.*grpo.*dr_grpo.*rloo.*reinforce_pp"):
            helper("ppo")  # type: ignore[arg-type]


# --- the KL loss (GRPO's "KL in the loss"; its gradients on a tabular policy: test_kl_loss_gradient.py) ---

# logprobs - ref = 0.5, -1.0, 0.0 on the valid slots; slot 3 is padding holding garbage.
KL_LOGPROBS = torch.tensor([[-1.0, -2.0, -0.5, 9.0]])
KL_REF = torch.tensor([[-1.5, -1.0, -0.5, 0.0]])
KL_MASK = torch.tensor([[T, T, T, F]])
# logprobs - old = ln 2, -ln 2, 0: the weights pi / pi_old are 2, 1/2, 1; padding's old is -inf.
KL_OLD = KL_LOGPROBS - torch.tensor([[math.log(2.0), -math.log(2.0), 0.0, 0.0]])
KL_OLD[0, 3] = -math.inf


def test_kl_loss_k3_hand_worked():
    # r = ref - logprobs = -0.5, 1, 0; k3 = e^r - r - 1:
    #   e^-0.5 - (-0.5) - 1 = 0.60653066 - 0.5 = 0.10653066 ; e - 1 - 1 = 0.71828183 ; 0
    #   mean over 3 tokens = 0.82481249 / 3 = 0.27493750
    assert_close(kl_loss(KL_LOGPROBS, KL_REF, KL_MASK, "k3"), torch.tensor(0.27493750))
    # The default, k3_weighted, on-policy (no old logprobs): every weight is 1, the same value.
    assert_close(kl_loss(KL_LOGPROBS, KL_REF, KL_MASK), torch.tensor(0.27493750))


def test_kl_loss_k3_gradient_hand_worked():
    # d k3 / d logprobs = 1 - e^r, divided by the 3 counted tokens:
    #   (1 - 0.60653066) / 3 = 0.13115645 ; (1 - 2.71828183) / 3 = -0.57276061 ; 0 ; padding 0
    logprobs = KL_LOGPROBS.clone().requires_grad_(True)
    ref = KL_REF.clone().requires_grad_(True)
    kl_loss(logprobs, ref, KL_MASK, "k3").backward()
    assert_close(logprobs.grad, torch.tensor([[0.13115645, -0.57276061, 0.0, 0.0]]))
    assert_close(ref.grad, torch.tensor([[-0.13115645, 0.57276061, 0.0, 0.0]]))


def test_kl_loss_k3_weighted_hand_worked():
    # w * k3 with w = 2, 1/2, 1 and k3 as above: 0.21306132 + 0.35914092 + 0 = 0.57220224, / 3 = 0.19073408.
    assert_close(kl_loss(KL_LOGPROBS, KL_REF, KL_MASK, "k3_weighted", old_logprobs=KL_OLD), torch.tensor(0.19073408))
    # d (w k3) / d logprobs = w k3 + w (1 - e^r) = w (logprobs - ref), / 3 tokens:
    #   2 * 0.5 / 3 = 0.33333333 ; 0.5 * -1 / 3 = -0.16666667 ; 0 ; padding 0 (its -inf old stays out)
    logprobs = KL_LOGPROBS.clone().requires_grad_(True)
    kl_loss(logprobs, KL_REF, KL_MASK, "k3_weighted", old_logprobs=KL_OLD).backward()
    assert_close(logprobs.grad, torch.tensor([[1 / 3, -1 / 6, 0.0, 0.0]]))


def test_kl_loss_k2_hand_worked():
    # k2 = (logprobs - ref)^2 / 2 = 0.125, 0.5, 0: mean 0.625 / 3 = 0.20833333; it reads no old logprobs.
    assert_close(kl_loss(KL_LOGPROBS, KL_REF, KL_MASK, "k2", old_logprobs=KL_OLD), torch.tensor(0.625 / 3))


def test_kl_loss_refuses_an_estimator_whose_gradient_is_no_kls():
    # k1's gradient is grad log pi, 0 in expectation: no pull toward the reference at all.
    with pytest.raises(ValueError, match="'k1'.*k3_weighted, k2, k3"):
        kl_loss(KL_LOGPROBS, KL_REF, KL_MASK, kind="k1")  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["k3_weighted", "k2", "k3"])
def test_kl_loss_gradcheck(kind):
    torch.manual_seed(0)
    logprobs = (-torch.rand(3, 5, dtype=torch.float64) * 3).requires_grad_(True)
    ref = (-torch.rand(3, 5, dtype=torch.float64) * 3).requires_grad_(True)
    old = -torch.rand(3, 5, dtype=torch.float64) * 3
    mask = torch.tensor([[T, T, T, F, F], [F, T, T, T, T], [F, F, T, F, F]])
    assert torch.autograd.gradcheck(lambda a, b: kl_loss(a, b, mask, kind, old_logprobs=old), (logprobs, ref))

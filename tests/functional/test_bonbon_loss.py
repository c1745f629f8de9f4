"""The BoNBoN loss and its coefficient beta_N against hand-worked values."""

import pytest
import torch
from torch.testing import assert_close

from rlhf_lit.functional import bonbon_beta, bonbon_loss, bonbon_target, check_bonbon_n, check_bonbon_settings

torch.set_num_threads(1)

# ---------------------------------------------------------------- the coefficient from N, by hand
# target (N - 1) H_(N-1) = 1 / (2 beta_N):
#   N = 2: 1 * 1                                   = 1         -> beta 1/2
#   N = 4: 3 * (1 + 1/2 + 1/3)      = 3 * 11/6     = 5.5       -> beta 1/11
#   N = 8: 7 * H_7 = 7 * 363/140    = 2541/140     = 18.15     -> beta 1/36.3 = 10/363
HAND = {2: (1.0, 0.5), 4: (5.5, 1 / 11), 8: (18.15, 10 / 363)}


@pytest.mark.parametrize("n", sorted(HAND))
def test_beta_is_derived_from_n_by_hand(n):
    target, beta = HAND[n]
    assert bonbon_target(n) == pytest.approx(target, rel=1e-12)
    assert bonbon_beta(n) == pytest.approx(beta, rel=1e-12)


@pytest.mark.parametrize("n", [2, 3, 4, 8, 16, 64])
def test_target_is_the_expected_log_ratio_gap_of_best_over_worst(n):
    # Independent of the closed form: under best-of-N the log ratio to the reference is
    # log N + (N - 1) log U with U = F(reward) of the response; for the best of N samples U ~ Beta(N, 1),
    # for the worst U ~ Beta(1, N), and E log Beta(a, b) = digamma(a) - digamma(a + b).
    psi = torch.special.digamma
    a = torch.tensor(float(n), dtype=torch.float64)
    one = torch.tensor(1.0, dtype=torch.float64)
    e_log_best = psi(a) - psi(a + one)  # -1/N
    e_log_worst = psi(one) - psi(one + a)  # -H_N
    assert bonbon_target(n) == pytest.approx(float((n - 1) * (e_log_best - e_log_worst)), rel=1e-12)


def test_target_by_simulation_of_uniform_order_statistics():
    # The same gap by Monte Carlo: F(reward) of N reference samples are N uniforms.
    g = torch.Generator().manual_seed(0)
    n = 4
    u = torch.rand(200_000, n, generator=g, dtype=torch.float64)
    gap = (n - 1) * (u.max(-1).values.log() - u.min(-1).values.log())  # (S,)
    assert float(gap.mean()) == pytest.approx(5.5, abs=0.05)  # 3 standard errors ~ 0.02


# ---------------------------------------------------------------- the loss, two pairs, N = 4, alpha = 0.1
# beta_4 = 1/11: target 1/(2 beta) = 5.5
# pair 1: policy best -10, worst -14; reference best -12, worst -13
#         log ratios: best +2, worst -1  -> h = 3;  (3 - 5.5)^2  = 6.25;  SFT 10
#         0.1 * 10 + 0.9 * 6.25  = 1 + 5.625  = 6.625
# pair 2: policy best -20, worst -15; reference best -21, worst -18
#         log ratios: best +1, worst +3  -> h = -2; (-2 - 5.5)^2 = 56.25; SFT 20
#         0.1 * 20 + 0.9 * 56.25 = 2 + 50.625 = 52.625
# mean: (6.625 + 52.625) / 2 = 29.625
BEST = [-10.0, -20.0]
WORST = [-14.0, -15.0]
REF_BEST = [-12.0, -21.0]
REF_WORST = [-13.0, -18.0]
ALPHA = 0.1


def _inputs(dtype=torch.float32):
    policy = [torch.tensor(x, dtype=dtype, requires_grad=True) for x in (BEST, WORST)]
    return (*policy, torch.tensor(REF_BEST, dtype=dtype), torch.tensor(REF_WORST, dtype=dtype))


def test_loss_by_hand():
    loss, stats = bonbon_loss(*_inputs(), beta=bonbon_beta(4), alpha=ALPHA)
    assert_close(loss, torch.tensor(29.625))
    assert_close(stats["sft_loss"], torch.tensor(15.0))  # (10 + 20) / 2
    assert_close(stats["ipo_loss"], torch.tensor(31.25))  # (6.25 + 56.25) / 2
    # implicit rewards beta * log ratio: best (2, 1) / 11, worst (-1, 3) / 11
    assert_close(stats["rewards_chosen"], torch.tensor(1.5 / 11))
    assert_close(stats["rewards_rejected"], torch.tensor(1.0 / 11))
    assert_close(stats["reward_accuracy"], torch.tensor(0.5))  # pair 1: 2 > -1; pair 2: 1 < 3
    assert_close(stats["reward_margin"], torch.tensor(0.5 / 11))  # beta h = (3, -2) / 11
    assert_close(stats["implicit_kl"], torch.tensor(1.25))  # (2 - 1 + 1 + 3) / 4
    assert all(not v.requires_grad and v.dim() == 0 for v in stats.values())


def test_swapping_best_and_worst_changes_the_loss():
    # Best and worst swapped: pair 1 h = -3, (-8.5)^2 = 72.25, SFT 14: 1.4 + 65.025 = 66.425;
    # pair 2 h = 2, (-3.5)^2 = 12.25, SFT 15: 1.5 + 11.025 = 12.525; mean 39.475.
    best, worst, ref_best, ref_worst = _inputs()
    swapped, _ = bonbon_loss(worst, best, ref_worst, ref_best, beta=bonbon_beta(4), alpha=ALPHA)
    assert_close(swapped, torch.tensor(39.475))


def test_gradients_reach_both_policy_logprobs_by_hand():
    # dL/d logps_best_i  = (-alpha + (1 - alpha) 2 (h_i - 5.5)) / B
    #   pair 1: (-0.1 + 0.9 * 2 * -2.5) / 2 = (-0.1 - 4.5) / 2  = -2.3
    #   pair 2: (-0.1 + 0.9 * 2 * -7.5) / 2 = (-0.1 - 13.5) / 2 = -6.8
    # dL/d logps_worst_i = -(1 - alpha) 2 (h_i - 5.5) / B
    #   pair 1: 0.9 * 5 / 2 = 2.25;  pair 2: 0.9 * 15 / 2 = 6.75
    best, worst, ref_best, ref_worst = _inputs()
    loss, _ = bonbon_loss(best, worst, ref_best, ref_worst, beta=bonbon_beta(4), alpha=ALPHA)
    loss.backward()
    assert_close(best.grad, torch.tensor([-2.3, -6.8]))
    assert_close(worst.grad, torch.tensor([2.25, 6.75]))


def test_alpha_ends_are_pure_sft_and_pure_ipo():
    sft_only, _ = bonbon_loss(*_inputs(), beta=bonbon_beta(4), alpha=1.0)
    ipo_only, _ = bonbon_loss(*_inputs(), beta=bonbon_beta(4), alpha=0.0)
    assert_close(sft_only, torch.tensor(15.0))
    assert_close(ipo_only, torch.tensor(31.25))


def test_gradcheck_float64():
    best, worst, ref_best, ref_worst = _inputs(torch.float64)
    ref_best.requires_grad_(True)
    ref_worst.requires_grad_(True)

    def f(a, b, c, d):
        return bonbon_loss(a, b, c, d, beta=bonbon_beta(4), alpha=ALPHA)[0]

    assert torch.autograd.gradcheck(f, (best, worst, ref_best, ref_worst))


@pytest.mark.parametrize("n", [1, 0, -3, 2.0, True, "4"])
def test_n_below_two_or_not_an_integer_is_refused(n):
    with pytest.raises(ValueError, match=r"n must be an integer >= 2"):
        check_bonbon_n(n)


@pytest.mark.parametrize(
    ("alpha", "beta", "message"),
    [
        (-0.1, None, r"alpha must be in \[0, 1\]"),
        (1.5, None, r"alpha must be in \[0, 1\]"),
        (0.1, 0.0, r"beta must be > 0, or null to derive it from n"),
        (0.1, -1.0, r"beta must be > 0"),
        (0.1, float("inf"), r"beta must be a finite number, or null to derive it from n, got inf"),
    ],
)
def test_bad_settings_are_refused(alpha, beta, message):
    with pytest.raises(ValueError, match=message):
        check_bonbon_settings(alpha, beta)

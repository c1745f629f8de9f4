"""Calibrated rewards: quantiles of a hand-made score table (ties, both ends), the transforms by hand,
and on a categorical bandit the KL-regularised optimum of the calibrated reward against best-of-n
computed by enumerating its draws (and a PPO-style optimisation that gets there)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from rlhf_lit.functional.calibration import calibrated_scores, quantile_bounds, reference_quantiles, transform_quantiles

# K = 4 reference scores per row; the pooled sample has K + 1 = 5 scores (the row's own included).
REFERENCES = torch.tensor(
    [
        [1.0, 2.0, 2.0, 3.0],  # the score 2.0 ties two references and beats one
        [1.0, 2.0, 2.0, 3.0],  # 0.0: below every reference (the bottom end)
        [1.0, 2.0, 2.0, 3.0],  # 5.0: above every reference (the top end)
        [3.0, 3.0, 3.0, 3.0],  # 3.0: equal to all four
        [0.5, -1.0, 2.5, 1.5],  # 1.5: beats two, ties one, unsorted
    ]
)
SCORES = torch.tensor([2.0, 0.0, 5.0, 3.0, 1.5])


def test_quantiles_of_a_hand_made_table():
    lower, upper = quantile_bounds(SCORES, REFERENCES)
    # lower = below / 5; upper = (below + ties + 1) / 5
    # row 0: below 1, ties 2 -> 1/5, 4/5; row 1: 0, 0 -> 0, 1/5; row 2: 4, 0 -> 4/5, 1;
    # row 3: 0, 4 -> 0, 1; row 4: below 2 (0.5, -1.0), ties 1 -> 2/5, 4/5
    torch.testing.assert_close(lower, torch.tensor([0.2, 0.0, 0.8, 0.0, 0.4], dtype=torch.float64))
    torch.testing.assert_close(upper, torch.tensor([0.8, 0.2, 1.0, 1.0, 0.8], dtype=torch.float64))
    # mid = (below + ties/2 + 1/2) / 5: (1 + 1 + .5)/5, (0 + 0 + .5)/5, (4 + .5)/5, (0 + 2 + .5)/5, (2 + .5 + .5)/5
    expected = torch.tensor([0.5, 0.1, 0.9, 0.5, 0.6], dtype=torch.float64)
    torch.testing.assert_close(reference_quantiles(SCORES, REFERENCES), expected)
    torch.testing.assert_close(calibrated_scores(SCORES, REFERENCES, "identity"), expected.float())


def test_the_ends_stay_inside_zero_and_one_and_log_stays_finite():
    below_all = calibrated_scores(torch.tensor([-1e30]), torch.zeros(1, 9), "log")
    # K = 9: the bottom mid-quantile is 0.5 / 10 = 0.05, log 0.05 = -2.995732273553991
    assert below_all.item() == pytest.approx(-2.995732273553991)
    above_all = calibrated_scores(torch.tensor([1e30]), torch.zeros(1, 9), "identity")
    assert above_all.item() == pytest.approx(0.95)  # (9 + 0.5) / 10: never 1
    # The table under log: log 0.5, log 0.1, log 0.9, log 0.5, log 0.6
    expected = [
        -0.6931471805599453,
        -2.3025850929940455,
        -0.10536051565782628,
        -0.6931471805599453,
        -0.5108256237659907,
    ]
    torch.testing.assert_close(calibrated_scores(SCORES, REFERENCES, "log"), torch.tensor(expected))


def test_best_of_n_transform_by_hand():
    got = calibrated_scores(SCORES[:3], REFERENCES[:3], "best_of_n", n=3)
    # (1/2) log((u^2 + u l + l^2) / 3):
    # row 0: l .2, u .8: (.64 + .16 + .04) / 3 = .28 -> log(.28) / 2 = -0.6364828379064438
    # row 1: l 0, u .2: .04 / 3 -> (log .04 - log 3) / 2 = -2.158744056768155 (finite at the bottom)
    # row 2: l .8, u 1: (1 + .8 + .64) / 3 = 2.44 / 3 -> -0.10330712468149958
    torch.testing.assert_close(got, torch.tensor([-0.6364828379064438, -2.158744056768155, -0.10330712468149958]))
    # n = 2: (u + l) / 2 is the mid-point: best_of_n is log
    torch.testing.assert_close(
        calibrated_scores(SCORES, REFERENCES, "best_of_n", n=2), calibrated_scores(SCORES, REFERENCES, "log")
    )
    with pytest.raises(ValueError, match="n >= 2"):
        calibrated_scores(SCORES, REFERENCES, "best_of_n")
    with pytest.raises(ValueError, match="transform must be one of identity, log, best_of_n"):
        calibrated_scores(SCORES, REFERENCES, "exp")


def test_refuses_non_finite_scores_and_empty_references():
    with pytest.raises(ValueError, match="finite"):
        quantile_bounds(torch.tensor([float("nan")]), torch.zeros(1, 2))
    with pytest.raises(ValueError, match="at least one reference"):
        quantile_bounds(torch.tensor([0.0]), torch.zeros(1, 0))


# ---------------------------------------------------------------- the categorical bandit
# 5 arms; arms 1 and 3 share the best reward (a tie), so best-of-n must split between them.
PI_REF = [0.1, 0.2, 0.3, 0.15, 0.25]
REWARD = [1.0, 3.0, 2.0, 3.0, 0.5]


def _population_bounds() -> tuple[torch.Tensor, torch.Tensor]:
    """P(r < r(y)) and P(r <= r(y)) under PI_REF, by plain loops."""
    lower = [sum(p for p, r in zip(PI_REF, REWARD) if r < ry) for ry in REWARD]
    upper = [sum(p for p, r in zip(PI_REF, REWARD) if r <= ry) for ry in REWARD]
    return torch.tensor(lower, dtype=torch.float64), torch.tensor(upper, dtype=torch.float64)


def _best_of_n_by_enumeration(n: int) -> torch.Tensor:
    """P(best of n draws from PI_REF is arm y), over every n-tuple of arms; a tie on the best reward
    goes to the first draw among the tied (its arm is then drawn from PI_REF within the tie)."""
    probs = [0.0] * len(PI_REF)
    for draws in itertools.product(range(len(PI_REF)), repeat=n):
        weight = math.prod(PI_REF[a] for a in draws)
        best = max(REWARD[a] for a in draws)
        probs[next(a for a in draws if REWARD[a] == best)] += weight
    return torch.tensor(probs, dtype=torch.float64)


def _best_of_n_by_order_statistics(n: int) -> torch.Tensor:
    """P(max of n draws has reward r(y)) = F(r)^n - F-(r)^n, split over the arms tied at r(y) as PI_REF."""
    out = []
    for ry, p in zip(REWARD, PI_REF):
        below = sum(q for q, r in zip(PI_REF, REWARD) if r < ry)
        at = sum(q for q, r in zip(PI_REF, REWARD) if r == ry)
        out.append(((below + at) ** n - below**n) * p / at)
    return torch.tensor(out, dtype=torch.float64)


def _kl_regularised_optimum(reward: torch.Tensor, coef: float) -> torch.Tensor:
    """argmax_pi E_pi[reward] - coef KL(pi || pi_ref) = pi_ref exp(reward / coef) / Z (Gibbs)."""
    return torch.softmax(torch.tensor(PI_REF, dtype=torch.float64).log() + reward / coef, dim=0)


def _objective(pi: torch.Tensor, reward: torch.Tensor, coef: float) -> torch.Tensor:
    ref = torch.tensor(PI_REF, dtype=torch.float64)
    return (pi * reward).sum() - coef * (pi * (pi / ref).log()).sum()


def test_the_two_best_of_n_references_agree():
    for n in (2, 3, 4):
        torch.testing.assert_close(_best_of_n_by_order_statistics(n), _best_of_n_by_enumeration(n), rtol=0, atol=1e-15)


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_the_kl_regularised_optimum_of_the_best_of_n_transform_is_best_of_n(n):
    lower, upper = _population_bounds()
    reward = transform_quantiles(lower, upper, "best_of_n", n)  # (5,)
    optimum = _kl_regularised_optimum(reward, 1 / (n - 1))
    best_of_n = _best_of_n_by_enumeration(n) if n <= 4 else _best_of_n_by_order_statistics(n)
    torch.testing.assert_close(optimum, best_of_n, rtol=0, atol=1e-14)
    # The closed form is the optimum: any nearby policy scores lower on E[reward] - KL / (n - 1).
    generator = torch.Generator().manual_seed(n)
    for _ in range(20):
        nearby = torch.softmax(optimum.log() + 0.05 * torch.randn(5, generator=generator, dtype=torch.float64), 0)
        assert _objective(nearby, reward, 1 / (n - 1)) < _objective(optimum, reward, 1 / (n - 1))


def test_log_of_the_mid_quantile_is_exact_for_n_2_and_an_approximation_beyond():
    lower, upper = _population_bounds()
    reward = transform_quantiles(lower, upper, "log")  # log((F- + F) / 2): ties at the mid-point
    torch.testing.assert_close(_kl_regularised_optimum(reward, 1.0), _best_of_n_by_enumeration(2), rtol=0, atol=1e-15)
    # n = 4 on five coarse atoms: off by a few hundredths (total variation), not float precision.
    gap = (_kl_regularised_optimum(reward, 1 / 3) - _best_of_n_by_enumeration(4)).abs().sum() / 2
    assert 1e-3 < gap < 0.1


def test_ppo_on_the_bandit_approaches_best_of_n():
    """A softmax policy trained by sampled PPO steps (clipped ratio, k1 KL in the reward, a mean baseline)
    on the ``best_of_n`` reward with KL coefficient 1 / (n - 1) ends near pi_BoN."""
    n, coef = 4, 1 / 3
    lower, upper = _population_bounds()
    reward = transform_quantiles(lower, upper, "best_of_n", n).float()  # (5,)
    ref_logprobs = torch.tensor(PI_REF).log()  # (5,)
    logits = ref_logprobs.clone().requires_grad_(True)  # the policy starts at the reference
    optimizer = torch.optim.Adam([logits], lr=0.03)
    generator = torch.Generator().manual_seed(0)
    for _ in range(300):
        with torch.no_grad():
            old_logprobs = torch.log_softmax(logits, 0)  # (5,)
            arms = torch.multinomial(old_logprobs.exp(), 512, replacement=True, generator=generator)  # (512,)
            returns = reward[arms] - coef * (old_logprobs[arms] - ref_logprobs[arms])  # (512,)
            advantages = returns - returns.mean()  # (512,)
        for _epoch in range(2):
            ratio = (torch.log_softmax(logits, 0)[arms] - old_logprobs[arms]).exp()  # (512,)
            loss = -torch.min(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    trained = torch.softmax(logits.detach().double(), 0)
    target = _best_of_n_by_enumeration(n)
    start_gap = (torch.tensor(PI_REF, dtype=torch.float64) - target).abs().sum() / 2
    gap = (trained - target).abs().sum() / 2  # total variation
    assert gap < 0.03 < start_gap, f"TV to pi_BoN {gap:.4f} (from {start_gap:.4f})"

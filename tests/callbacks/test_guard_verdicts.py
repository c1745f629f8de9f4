"""The guard's rules on constructed trajectories: each fires on one that should fire it and stays
silent on one that should not; the expected numbers are worked by hand in the comments."""

from __future__ import annotations

import math

import pytest

from rlhf_lit.callbacks.guard import (
    DisagreementSignal,
    DistinctSignal,
    KLSignal,
    LengthSignal,
    ObjectiveSignal,
    ProxyGoldSignal,
)
from rlhf_lit.callbacks.guard.signals import Evaluation
from rlhf_lit.callbacks.guard.verdicts import drift, falling, fitted_line

REL = 1e-6


def test_fitted_line_slope_and_t_by_hand():
    # x 0,1,2; y 1,3,2: means 1, 2; Sxx 2, Sxy 1 -> slope 0.5; residuals -0.5, 1, -0.5 -> SSR 1.5,
    # se = sqrt(1.5 / 1 / 2) = 0.8660 -> t = 0.57735
    slope, t = fitted_line([1.0, 3.0, 2.0])
    assert slope == pytest.approx(0.5, rel=REL) and t == pytest.approx(0.5 / math.sqrt(0.75), rel=REL)
    assert fitted_line([1.0, 2.0, 3.0]) == (1.0, math.inf)  # exactly on a line: no residual
    assert fitted_line([1.0, 1.0, 1.0]) == (0.0, 0.0)  # constant (a 0/1 reward all 1): no trend


def test_kl_ceiling_and_rate():
    ceiling = KLSignal(action="warn", ceiling=5.0)
    fired = ceiling.verdict({"objective/kl": [1.0, 4.0, 6.0]})
    assert fired.holds and fired.value == 6.0 and fired.threshold == 5.0
    assert not ceiling.verdict({"objective/kl": [1.0, 4.0, 5.0]}).holds  # at the ceiling is not above it
    rate = KLSignal(action="warn", max_rate=1.0, window=3)
    # y 0, 1, 2.5: mean 7/6; Sxy = 7/6 + 4/3 = 2.5; Sxx 2 -> slope 1.25 nats per rollout
    fast = rate.verdict({"objective/kl": [5.0, 0.0, 1.0, 2.5]})  # only the last 3 count
    assert fast.holds and fast.value == pytest.approx(1.25, rel=REL)
    assert not rate.verdict({"objective/kl": [0.0, 1.0, 2.0]}).holds  # slope 1: not above 1
    assert rate.verdict({"objective/kl": [0.0, 1.0]}) is None  # too few rollouts: not available
    assert KLSignal(action="warn", ceiling=5.0).verdict({}) is None  # no KL logged: not available


def test_length_drift_either_way():
    signal = LengthSignal(action="warn", baseline=2, window=2)  # relative 0.5, absolute 4 tokens
    # baseline (40 + 42) / 2 = 41 -> threshold max(0.5 * 41, 4) = 20.5; last two (18 + 20) / 2 = 19: -22
    fired = signal.verdict({"response/length": [40.0, 42.0, 50.0, 44.0, 18.0, 20.0]})
    assert fired.holds and fired.value == pytest.approx(22.0, rel=REL) and fired.threshold == pytest.approx(20.5)
    assert not signal.verdict({"response/length": [40.0, 42.0, 50.0, 44.0, 30.0, 32.0]}).holds  # -10
    assert signal.verdict({"response/length": [40.0, 40.0, 80.0, 80.0]}).holds  # 40 -> 80: +40 counts too
    assert signal.verdict({"response/length": [40.0, 42.0, 50.0]}) is None  # windows not full yet


def test_distinct_collapse_down_only():
    signal = DistinctSignal(action="warn", baseline=2, window=2)  # relative 0.3, absolute 0.05
    # 0.8 -> 0.5: a fall of 0.3 > max(0.3 * 0.8 = 0.24, 0.05)
    assert signal.verdict({"diversity/distinct_2": [0.8, 0.8, 0.7, 0.5, 0.5]}).holds
    assert not signal.verdict({"diversity/distinct_2": [0.8, 0.8, 0.7, 0.7, 0.7]}).holds  # 0.1 < 0.24
    assert not signal.verdict({"diversity/distinct_2": [0.5, 0.5, 0.9, 0.9]}).holds  # a rise is no collapse


def test_disagreement_from_a_zero_baseline_needs_the_absolute_floor():
    signal = DisagreementSignal(action="warn", baseline=2, window=2)  # relative 0.5, absolute 0.05
    # baseline 0 (members agree exactly): any relative rise is infinite; the threshold is the floor 0.05
    assert not signal.verdict({"reward/reward_model/std": [0.0, 0.0, 0.0, 0.04, 0.04]}).holds
    fired = signal.verdict({"reward/reward_model/std": [0.0, 0.0, 0.0, 0.1, 0.1]})
    assert fired.holds and fired.threshold == 0.05
    # 0.2 -> 0.35: +0.15 > max(0.5 * 0.2, 0.05) = 0.1
    assert signal.verdict({"reward/reward_model/std": [0.2, 0.2, 0.35, 0.35]}).holds
    assert signal.verdict({"reward/reward_model/std": [None, None, None, None, None]}) is None  # no ensemble


def test_objective_falling_line_and_noise():
    signal = ObjectiveSignal(action="warn", window=5)  # min_drop 0.1, min_t 3
    # exactly on a line from 1.0 down 0.1 a rollout: a fall of 0.4 across the window, t = -inf
    fired = signal.verdict({"objective/rlhf_reward": [1.0, 0.9, 0.8, 0.7, 0.6]})
    assert fired.holds and fired.value == pytest.approx(0.4, rel=REL)
    assert not signal.verdict({"objective/rlhf_reward": [0.6, 0.7, 0.8, 0.9, 1.0]}).holds  # rising
    # falls 0.4 but noisily: y 1.0, 0.2, 1.0, 0.2, 0.6 -> Sxy -0.8, slope -0.08, fall 0.32; SSR 0.576
    # -> se sqrt(0.576 / 3 / 10) = 0.1386, t = -0.577: not beyond the noise
    assert not signal.verdict({"objective/rlhf_reward": [1.0, 0.2, 1.0, 0.2, 0.6]}).holds


def test_zero_one_reward_healthy_run_is_silent_and_a_real_fall_fires():
    """A verifiable 0/1 reward: a batch mean of 4 samples moves by quarters by chance; the reward
    may be 1 (or 0) for every sample, its standard deviation 0. No rule may fire on that."""
    noisy = [0.5, 0.75, 0.25, 0.5, 0.75, 0.25, 0.5, 0.5, 0.25, 0.75]
    # mean 0.5; Sxy = -0.25, Sxx = 82.5 -> slope -0.00303, a fall of 0.027 across 10 rollouts
    assert not ObjectiveSignal(action="stop").verdict({"objective/rlhf_reward": noisy}).holds
    for constant in ([1.0] * 10, [0.0] * 10):
        history = {
            "objective/rlhf_reward": constant,
            "objective/scores": constant,
            "objective/kl": [0.0] * 10,
            "reward/reward_model/std": [0.0] * 10,
            "response/length": [12.0] * 10,
            "diversity/distinct_2": [0.5] * 10,
        }
        for signal in (
            ObjectiveSignal(action="stop"),
            DisagreementSignal(action="stop"),
            LengthSignal(action="stop"),
            DistinctSignal(action="stop"),
            KLSignal(action="stop", max_rate=0.0),
        ):
            assert not signal.verdict(history).holds, signal
    # a 0/1 reward really collapsing: mean 0.6, Sxy -9.5 -> slope -0.11515, a fall of 1.036; t far below -3
    collapsing = [1.0, 1.0, 1.0, 0.75, 0.75, 0.5, 0.5, 0.25, 0.25, 0.0]
    fired = ObjectiveSignal(action="stop").verdict({"objective/rlhf_reward": collapsing})
    assert fired.holds and fired.value == pytest.approx(9.5 / 82.5 * 9, rel=REL)


def test_proxy_rising_while_the_judge_stalls():
    signal = ProxyGoldSignal(action="warn", window=4)  # min_proxy_rise 0.1, max_gold_rise 0
    stalled = [Evaluation(r, s, j) for r, s, j in zip((5, 10, 15, 20), (0.0, 0.2, 0.4, 0.6), (0.6, 0.62, 0.61, 0.60))]
    # proxy: slope 0.04 per rollout, a rise of 0.6 over 15 rollouts; judge: Sxy -0.025, Sxx 125 ->
    # slope -0.0002, a change of -0.003 <= 0
    fired = signal.verdict({}, stalled)
    assert fired.holds and fired.value == pytest.approx(-0.003, rel=1e-5)
    rising = [Evaluation(e.rollouts, e.score, j) for e, j in zip(stalled, (0.5, 0.55, 0.6, 0.65))]
    assert not signal.verdict({}, rising).holds  # the judge follows the proxy: healthy
    flat = [Evaluation(e.rollouts, 0.3, e.judge) for e in stalled]
    assert not signal.verdict({}, flat).holds  # the proxy does not rise: nothing bought
    assert signal.verdict({}, stalled[:2]) is None
    # the rollout's own scores and judge (PPOModule(judge=...)), one point a rollout
    on_rollouts = ProxyGoldSignal(action="warn", source="rollout", window=4)
    history = {"objective/scores": [0.0, 0.2, 0.4, 0.6], "objective/judge": [0.6, 0.62, 0.61, 0.60]}
    assert on_rollouts.verdict(history, []).holds
    assert on_rollouts.verdict({"objective/scores": [0.0, 0.2, 0.4, 0.6]}, []) is None  # no judge logged


def test_drift_and_falling_skip_unlogged_rollouts():
    # a skipped rollout (non-finite: no metrics) is None and does not count
    assert drift([1.0, None, 1.0, 3.0, 3.0], 2, 2, "up", 0.5, 0.0, "m").holds
    assert falling([1.0, None, 0.9, 0.8], 3, 0.1, 3.0, "m").holds


@pytest.mark.parametrize(
    ("signal", "message"),
    [
        (KLSignal(action="warn"), "set kl.ceiling or kl.max_rate"),
        (ObjectiveSignal(action="warn", window=2), "objective.window must be >= 3"),
        (LengthSignal(action="warn", relative=0.0, absolute=0.0), "length: relative or absolute must be > 0"),
        (DistinctSignal(patience=0), "distinct.patience must be >= 1"),
    ],
)
def test_settings_no_run_can_use_are_refused(signal, message):
    with pytest.raises(ValueError, match=message):
        signal.check()

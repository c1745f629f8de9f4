"""Labelling: pairings, the Bradley-Terry probability and the seeded noisy labeller."""

from __future__ import annotations

import random

import pytest

from rlhf_lit.demo.labeling import bradley_terry_probability, candidate_pairs, prefer_first


def test_all_pairs_of_three():
    assert candidate_pairs([0.3, -0.1, 0.7], "all_pairs") == [(0, 1), (0, 2), (1, 2)]


def test_best_worst_takes_first_max_and_first_min():
    # max 0.9 first at index 1, min -0.3 at index 2.
    assert candidate_pairs([0.1, 0.9, -0.3, 0.9, -0.3], "best_worst") == [(1, 2)]


def test_best_worst_all_equal_is_one_tie_pair():
    assert candidate_pairs([0.5, 0.5, 0.5], "best_worst") == [(0, 1)]


def test_pairs_need_two_samples():
    with pytest.raises(ValueError, match="at least 2 samples"):
        candidate_pairs([0.5], "all_pairs")


@pytest.mark.parametrize(
    "a, b, temperature, expected",
    [
        (1.0, 0.0, 1.0, 0.7310585786300049),  # 1 / (1 + e^-1)
        (0.5, 0.0, 0.25, 0.8807970779778823),  # x = 0.5 / 0.25 = 2: 1 / (1 + e^-2)
        (0.0, 0.5, 0.25, 0.11920292202211755),  # x = -2: 1 - 0.8807970779778823
        (0.3, 0.3, 0.1, 0.5),  # equal scores
        (1.0, -1.0, 1e-9, 1.0),  # x = 2e9: no overflow
        (-1.0, 1.0, 1e-9, 0.0),  # x = -2e9: exp(-2e9) underflows to 0
    ],
)
def test_bradley_terry_probability(a, b, temperature, expected):
    assert bradley_terry_probability(a, b, temperature) == pytest.approx(expected)


@pytest.mark.parametrize("temperature", [0.0, -0.5])
def test_bradley_terry_temperature_must_be_positive(temperature):
    with pytest.raises(ValueError, match="temperature must be > 0"):
        bradley_terry_probability(1.0, 0.0, temperature)


def test_argmax_higher_wins_and_tie_is_dropped_without_drawing():
    rng = random.Random(0)
    state = rng.getstate()
    assert prefer_first(0.4, 0.1, "argmax", 1.0, rng) is True
    assert prefer_first(-0.2, 0.1, "argmax", 1.0, rng) is False
    assert prefer_first(0.1, 0.1, "argmax", 1.0, rng) is None
    assert rng.getstate() == state


def test_bradley_terry_known_draws():
    # random.Random(7) draws 0.3238..., 0.1508..., 0.6509...; scores 0.1 vs 0.0 at T = 0.25 give
    # p = sigmoid(0.4) = 0.5987, so A is preferred for the first two draws and not the third.
    rng = random.Random(7)
    assert [prefer_first(0.1, 0.0, "bradley_terry", 0.25, rng) for _ in range(3)] == [True, True, False]


def test_bradley_terry_zero_temperature_limit_is_argmax():
    pairs = [(0.9, 0.1), (0.1, 0.9), (-0.5, -0.49), (0.0001, 0.0), (-1.0, 1.0)]
    for seed in range(5):
        rng = random.Random(seed)
        for a, b in pairs:
            assert prefer_first(a, b, "bradley_terry", 1e-9, rng) == prefer_first(a, b, "argmax", 1.0, rng)


def test_bradley_terry_is_reproducible_per_seed():
    scores = [(0.2, 0.1), (0.0, 0.3), (0.5, 0.5)] * 30

    def labels(seed):
        rng = random.Random(seed)
        return [prefer_first(a, b, "bradley_terry", 0.25, rng) for a, b in scores]

    assert labels(3) == labels(3)
    assert labels(3) != labels(4)


def test_bradley_terry_equal_scores_is_a_fair_coin():
    rng = random.Random(1234)
    wins = sum(prefer_first(0.3, 0.3, "bradley_terry", 0.25, rng) for _ in range(1000))
    # 484 = how many of the first 1000 random.Random(1234).random() draws are below 0.5
    # (Python's Mersenne Twister stream is stable across versions); about half, as a fair coin.
    assert wins == 484

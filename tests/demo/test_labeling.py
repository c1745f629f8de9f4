"""Labelling: pairings, rankings, the Bradley-Terry probability and the seeded noisy labellers."""

from __future__ import annotations

import math
import random

import pytest

from demo.labeling import bradley_terry_probability, candidate_pairs, plackett_luce_order, prefer_first, rank_samples


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


def test_argmax_ranking_by_hand_with_a_tie():
    # scores by sample: 0.2, 0.9, -0.4, 0.2 -> order 1 (0.9), 0 and 3 (0.2, tied, sample order kept), 2 (-0.4).
    rng = random.Random(0)
    state = rng.getstate()
    assert rank_samples([0.2, 0.9, -0.4, 0.2], "argmax", 1.0, rng) == ([1, 0, 3, 2], [0, 1, 1, 2])
    assert rng.getstate() == state  # argmax draws nothing


def _plackett_luce_by_hand(scores, temperature, draws):
    """An independent re-implementation: place by place, inverse-CDF of exp(s / T) over the samples left."""
    left, order = list(range(len(scores))), []
    for u in draws:
        weights = [math.exp(scores[i] / temperature) for i in left]
        total, acc = sum(weights), 0.0
        for n, w in enumerate(weights):  # noqa: B007 (n is the sample drawn, read after the loop)
            acc += w / total
            if u < acc:
                break
        order.append(left.pop(n))
    return order + left


def test_plackett_luce_known_draws_and_their_count():
    # random.Random(7) draws 0.3238..., 0.1508..., 0.6509...: K = 4 takes exactly K - 1 = 3 of them.
    scores, temperature = [0.1, 0.5, -0.3, 0.2], 0.25
    rng = random.Random(7)
    order = plackett_luce_order(scores, temperature, rng)
    after = random.Random(7)
    draws = [after.random() for _ in range(3)]
    assert rng.random() == after.random()  # the next number of both streams: 3 draws were used, no more
    assert order == _plackett_luce_by_hand(scores, temperature, draws)
    # By hand: weights e^0.4, e^2, e^-1.2, e^0.8 = 1.49, 7.39, 0.30, 2.23 (sum 11.41): first place
    # 0.3238 * 11.41 = 3.69 falls past sample 0 (1.49) into sample 1 (up to 8.88); then among 0, 2, 3
    # (sum 4.02), 0.1508 * 4.02 = 0.61 < 1.49 picks sample 0.
    assert order[:2] == [1, 0]


def test_plackett_luce_is_reproducible_per_seed():
    scores = [0.3, -0.1, 0.2, 0.25, 0.0]

    def orders(seed):
        return [plackett_luce_order(scores, 0.25, r) for r in [random.Random(seed)] for _ in range(40)]

    assert orders(3) == orders(3)
    assert orders(3) != orders(4)


def test_plackett_luce_small_temperature_is_the_score_order():
    scores = [0.2, 0.9, -0.4, 0.21, 0.5]  # distinct scores, gaps >= 0.01 >> T = 1e-4
    for seed in range(20):
        assert plackett_luce_order(scores, 1e-4, random.Random(seed)) == [1, 4, 3, 0, 2]


def test_plackett_luce_of_two_is_the_bradley_terry_labeller():
    # K = 2: the first place goes to sample 0 with probability sigmoid((a - b) / T), on the same draw.
    for seed in range(50):
        a, b = random.Random(seed).uniform(-1, 1), random.Random(seed + 100).uniform(-1, 1)
        first = plackett_luce_order([a, b], 0.25, random.Random(seed)) == [0, 1]
        assert first == prefer_first(a, b, "bradley_terry", 0.25, random.Random(seed))


def test_plackett_luce_first_place_frequencies():
    # P(sample i first) = exp(s_i / T) / sum_j exp(s_j / T); 4000 seeded draws within 4 standard errors.
    scores, temperature, n = [0.0, 0.25, 0.5], 0.25, 4000
    weights = [math.exp(s / temperature) for s in scores]
    rng = random.Random(11)
    firsts = [plackett_luce_order(scores, temperature, rng)[0] for _ in range(n)]
    for i, w in enumerate(weights):
        p = w / sum(weights)
        assert abs(firsts.count(i) / n - p) < 4 * math.sqrt(p * (1 - p) / n)


def test_bradley_terry_ranking_is_a_strict_order():
    order, ranks = rank_samples([0.3, 0.3, 0.1], "bradley_terry", 0.25, random.Random(0))
    assert sorted(order) == [0, 1, 2] and ranks == [0, 1, 2]


def test_ranking_needs_two_samples_and_a_positive_temperature():
    with pytest.raises(ValueError, match="at least 2 samples"):
        rank_samples([0.5], "argmax", 1.0, random.Random(0))
    with pytest.raises(ValueError, match="temperature must be > 0"):
        plackett_luce_order([0.5, 0.1], 0.0, random.Random(0))
    with pytest.raises(ValueError, match="to make pairs"):
        candidate_pairs([0.5, 0.1], "ranking")

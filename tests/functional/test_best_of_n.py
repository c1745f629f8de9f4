"""Best-of-N: the analytic KL by hand, ranks and pick weights by hand, the subset estimator by enumeration."""

from __future__ import annotations

import itertools

import pytest
import torch

from rlhf_lit.functional.best_of_n import best_of_n_kl, best_of_n_weights, first_n_weights, reward_ranks, subset_weights


def test_analytic_kl_by_hand():
    assert best_of_n_kl(1) == 0.0  # log 1 - 0 / 1
    # log 2 = 0.6931471805599453; minus (2 - 1) / 2 = 0.5
    assert best_of_n_kl(2) == pytest.approx(0.1931471805599453)
    # log 4 = 1.3862943611198906; minus 3 / 4
    assert best_of_n_kl(4) == pytest.approx(0.6362943611198906)
    # log 64 = 4.1588830833596715; minus 63 / 64 = 0.984375
    assert best_of_n_kl(64) == pytest.approx(3.1745080833596715)
    with pytest.raises(ValueError, match="N >= 1"):
        best_of_n_kl(0)


def test_ranks_by_hand_ties_go_to_the_earlier_sample():
    scores = torch.tensor([[0.5, -1.0, 2.0, 0.5], [3.0, 2.0, 1.0, 0.0]])
    # row 0: 2.0 is best (4); the two 0.5s: index 0 beats index 3 (3, 2); -1.0 is worst (1)
    assert reward_ranks(scores).tolist() == [[3, 1, 4, 2], [4, 3, 2, 1]]


def test_subset_weights_by_hand():
    scores = torch.tensor([[0.5, -1.0, 2.0, 0.5]])  # ranks 3, 1, 4, 2
    # M = 4, N = 2: P(rank r is the best of a random pair) = C(r - 1, 1) / C(4, 2) = (r - 1) / 6
    expected = [2 / 6, 0.0, 3 / 6, 1 / 6]
    assert subset_weights(scores, 2)[0].tolist() == pytest.approx(expected)
    # N = 1: every sample alike, 1 / M
    assert subset_weights(scores, 1)[0].tolist() == pytest.approx([0.25] * 4)


def test_best_of_all_samples_picks_the_reward_argmax():
    scores = torch.tensor([[0.1, 0.9, -0.3, 0.4], [-2.0, -5.0, 1.0, 0.0]])
    for estimator in ("subsets", "first_n"):
        weights = best_of_n_weights(scores, 4, estimator)
        # the argmax (index 1, index 2) has all the weight; the argmin (2, 1) none
        assert weights.tolist() == [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]], estimator


def test_first_n_picks_the_best_of_the_prefix():
    scores = torch.tensor([[1.0, 3.0, 2.0, 5.0]])
    picks = [first_n_weights(scores, n).argmax(-1).item() for n in (1, 2, 3, 4)]
    assert picks == [0, 1, 1, 3]
    assert first_n_weights(torch.tensor([[2.0, 2.0]]), 2).tolist() == [[1.0, 0.0]]  # tie: the earlier one


def test_subset_weights_equal_brute_force_enumeration():
    torch.manual_seed(0)
    scores = torch.randint(0, 4, (3, 6)).double()  # few values: many ties
    m = scores.shape[1]
    for n in range(1, m + 1):
        expected = torch.zeros_like(scores)
        subsets = list(itertools.combinations(range(m), n))
        for p in range(scores.shape[0]):
            row = scores[p].tolist()
            for subset in subsets:
                best = min(subset, key=lambda i: (-row[i], i))  # highest score, then the earlier sample
                expected[p, best] += 1 / len(subsets)
        got = subset_weights(scores, n)
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12, msg=f"N = {n}")
        assert got.sum(-1).tolist() == pytest.approx([1.0] * 3)


def test_refusals():
    with pytest.raises(ValueError, match="1 <= N <= 3"):
        subset_weights(torch.zeros(1, 3), 4)
    with pytest.raises(ValueError, match="finite"):
        reward_ranks(torch.tensor([[0.0, float("nan")]]))
    with pytest.raises(ValueError, match="estimator"):
        best_of_n_weights(torch.zeros(1, 2), 1, "prefix")  # type: ignore[arg-type]

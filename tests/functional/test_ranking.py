"""Ranking batches: their pairs, InstructGPT's ranking loss and the ranking metrics.

Expected values come from the numbers written out by hand or from ``reference_loss`` below, an
independent re-implementation with explicit loops over prompts and pairs.
"""

import math

import pytest
import torch
from torch.testing import assert_close

from rlhf_lit.functional import pairwise_reward_loss, ranking_loss, ranking_metrics, ranking_pair_mask, ranking_pairs


def nll(x: float) -> float:
    """-log sigmoid(x) = log(1 + e^-x)."""
    return math.log1p(math.exp(-x))


def position_major(prompts: list[tuple[list[float], list[int]]], dtype=torch.float32):
    """``(scores, group, rank, responses_per_prompt)`` of prompts given as (scores, ranks), rows
    ordered as the ranking-batch contract says: every prompt's first response, then every second..."""
    scores, group, rank = [], [], []
    for position in range(max(len(s) for s, _ in prompts)):
        for b, (s, r) in enumerate(prompts):
            if position < len(s):
                scores.append(s[position])
                group.append(b)
                rank.append(r[position])
    return (
        torch.tensor(scores, dtype=dtype),
        torch.tensor(group),
        torch.tensor(rank),
        torch.tensor([len(s) for s, _ in prompts]),
    )


def reference_loss(prompts, weight=None) -> tuple[float, float]:
    """Loops: per prompt the mean of -log sigmoid over its untied pairs; the (weighted) mean over prompts."""
    losses, weights, wins, count = [], [], 0, 0
    for b, (s, r) in enumerate(prompts):
        terms = []
        for i in range(len(s)):
            for j in range(len(s)):
                if r[i] < r[j]:  # i better than j
                    terms.append(nll(s[i] - s[j]))
                    wins += s[i] > s[j]
                    count += 1
        if terms:
            losses.append(sum(terms) / len(terms))
            weights.append(1.0 if weight is None else weight[b])
    return sum(w * x for w, x in zip(weights, losses)) / sum(weights), wins / count


def loss_of(prompts, weight=None, dtype=torch.float32):
    scores, group, rank, k = position_major(prompts, dtype)
    w = None if weight is None else torch.tensor(weight, dtype=dtype)
    return ranking_loss(scores, group, rank, k, w)


# ----- the pairs ------------------------------------------------------------------------------------


def test_pairs_of_a_ranking_batch():
    # K = 3, 2 and 4 (the last with a tie between its 2nd and 3rd response), position-major rows:
    # rows 0-2 the first responses of prompts 0, 1, 2; rows 3-5 the second; row 6 prompt 0's third,
    # row 7 prompt 2's third; row 8 prompt 2's fourth.
    group = torch.tensor([0, 1, 2, 0, 1, 2, 0, 2, 2])
    rank = torch.tensor([0, 0, 0, 1, 1, 1, 2, 1, 2])
    better, worse, prompt = ranking_pairs(group, rank)
    # prompt 0: rows 0 > 3 > 6; prompt 1: 1 > 4; prompt 2: 2 > {5, 7} > 8, rows 5 and 7 tied (no pair)
    expected = [(0, 3, 0), (0, 6, 0), (1, 4, 1), (2, 5, 2), (2, 7, 2), (2, 8, 2), (3, 6, 0), (5, 8, 2), (7, 8, 2)]
    assert list(zip(better.tolist(), worse.tolist(), prompt.tolist())) == expected
    mask = ranking_pair_mask(group, rank)
    assert mask.shape == (9, 9) and int(mask.sum()) == 9 and not mask[5, 7] and not mask[7, 5]


# ----- the loss by hand -----------------------------------------------------------------------------


def test_k3_by_hand():
    # best first: 1.0 > 0.5 > -1.0; the three pairs' differences 0.5, 2.0, 1.5, averaged over C(3, 2) = 3
    loss, accuracy = loss_of([([1.0, 0.5, -1.0], [0, 1, 2])])
    assert_close(loss, torch.tensor((nll(0.5) + nll(2.0) + nll(1.5)) / 3))
    assert float(accuracy) == 1.0
    # the best scored below the second: differences -1 (wrong), 2, 3
    loss, accuracy = loss_of([([0.0, 1.0, -2.0], [0, 1, 2])])
    assert_close(loss, torch.tensor((nll(-1.0) + nll(2.0) + nll(3.0)) / 3))
    assert_close(accuracy, torch.tensor(2 / 3))
    # equal scores on a ranked pair count as wrong (strict, as pairwise_reward_loss): differences 0, 2, 2
    loss, accuracy = loss_of([([1.0, 1.0, -1.0], [0, 1, 2])])
    assert_close(loss, torch.tensor((nll(0.0) + nll(2.0) + nll(2.0)) / 3))
    assert_close(accuracy, torch.tensor(2 / 3))


def test_k4_by_hand():
    # scores 2, -1, 0.5, 0 best first: differences 3, 1.5, 2 | -1.5, -1 | 0.5 over C(4, 2) = 6 pairs
    loss, accuracy = loss_of([([2.0, -1.0, 0.5, 0.0], [0, 1, 2, 3])])
    expected = (nll(3.0) + nll(1.5) + nll(2.0) + nll(-1.5) + nll(-1.0) + nll(0.5)) / 6
    assert_close(loss, torch.tensor(expected))
    assert_close(accuracy, torch.tensor(4 / 6))


def test_a_tie_forms_no_pair():
    # ranks 0, 1, 1: pairs (0, 1) and (0, 2) only; the tied responses' order (0.3 vs -0.4) costs nothing
    loss, accuracy = loss_of([([1.0, 0.3, -0.4], [0, 1, 1])])
    assert_close(loss, torch.tensor((nll(0.7) + nll(1.4)) / 2))
    assert float(accuracy) == 1.0
    # a prompt whose responses are all tied has no pair: it leaves the mean over prompts
    alone, _ = loss_of([([1.0, 0.3, -0.4], [0, 1, 1])])
    with_tied, _ = loss_of([([1.0, 0.3, -0.4], [0, 1, 1]), ([5.0, -5.0], [0, 0])])
    assert_close(with_tied, alone)


MIXED = [
    ([0.2, 1.1, -0.3], [0, 1, 2]),  # K = 3
    ([0.9, -0.6], [0, 1]),  # K = 2
    ([1.5, -0.2, 0.4, 0.1], [0, 1, 2, 3]),  # K = 4
    ([-0.5, 0.7, 0.6, -1.2], [0, 1, 1, 2]),  # K = 4 with a tie
]


def test_mixed_k_is_averaged_per_prompt():
    loss, accuracy = loss_of(MIXED)
    expected_loss, expected_accuracy = reference_loss(MIXED)
    assert_close(loss, torch.tensor(expected_loss))
    assert_close(accuracy, torch.tensor(expected_accuracy))
    # the data tells the per-prompt normalisation from one mean over all 3 + 1 + 6 + 5 pairs
    all_pairs = [nll(s[i] - s[j]) for s, r in MIXED for i in range(len(s)) for j in range(len(s)) if r[i] < r[j]]
    assert len(all_pairs) == 15 and abs(sum(all_pairs) / 15 - expected_loss) > 0.02
    # the order of the rows does not matter
    scores, group, rank, k = position_major(MIXED)
    perm = torch.randperm(len(scores), generator=torch.Generator().manual_seed(0))
    permuted, _ = ranking_loss(scores[perm], group[perm], rank[perm], k)
    assert_close(permuted, loss)


def test_weight_per_prompt():
    weight = [2.0, 0.5, 1.0, 3.0]
    loss, accuracy = loss_of(MIXED, weight)
    expected_loss, expected_accuracy = reference_loss(MIXED, weight)
    assert_close(loss, torch.tensor(expected_loss))
    assert_close(accuracy, torch.tensor(expected_accuracy))  # accuracy is over pairs, unweighted
    assert abs(expected_loss - reference_loss(MIXED)[0]) > 0.02  # the weights change it
    # equal weights are the plain mean
    assert_close(loss_of(MIXED, [0.7] * 4)[0], loss_of(MIXED)[0])


def test_gradcheck():
    scores, group, rank, k = position_major(MIXED, torch.float64)
    scores.requires_grad_(True)
    weight = torch.tensor([2.0, 0.5, 1.0, 3.0], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda s: ranking_loss(s, group, rank, k)[0], (scores,))
    assert torch.autograd.gradcheck(lambda s: ranking_loss(s, group, rank, k, weight)[0], (scores,))
    _, accuracy = ranking_loss(scores, group, rank, k)
    assert not accuracy.requires_grad


@pytest.mark.parametrize("B", [1, 2, 7, 8, 16, 33, 41, 64])
def test_k2_is_the_pair_loss_bit_for_bit(B):
    generator = torch.Generator().manual_seed(B)
    scores = torch.randn(2 * B, generator=generator) * 3  # rows: chosen..., rejected... (concat_pairs)
    scores[B] = scores[0]  # a tied pair: accuracy counts it wrong in both
    pair_scores = scores.clone().requires_grad_(True)
    rank_scores = scores.clone().requires_grad_(True)
    pair_loss, pair_accuracy = pairwise_reward_loss(pair_scores[:B], pair_scores[B:])
    pair_loss.backward()
    group, rank = torch.arange(B).repeat(2), torch.arange(2).repeat_interleave(B)
    loss, accuracy = ranking_loss(rank_scores, group, rank, torch.full((B,), 2))
    loss.backward()
    assert torch.equal(loss, pair_loss)
    assert torch.equal(accuracy, pair_accuracy)
    assert torch.equal(rank_scores.grad, pair_scores.grad)


# ----- ranking metrics ------------------------------------------------------------------------------


def test_ranking_metrics_by_hand():
    prompts = [
        ([3.0, 2.0, 1.0], [0, 1, 2]),  # ordered: exact, tau 1
        ([2.0, 3.0, 1.0], [0, 1, 2]),  # one of 3 pairs swapped: tau (2 - 1) / 3
        ([1.0, 2.0, 3.0, 4.0], [0, 1, 2, 3]),  # reversed: tau -1
        ([3.0, 1.0, 2.0, 0.0], [0, 1, 1, 2]),  # tied pair in either order: still exact, tau 1
        ([3.0, 3.0, 1.0], [0, 1, 2]),  # equal scores on a labelled pair: neither, tau (2 - 0) / 3, not exact
        ([0.5, -0.5], [0, 1]),  # K = 2 right: tau 1
        ([1.0, 2.0], [0, 0]),  # no pair at all
    ]
    scores, group, rank, k = position_major(prompts)
    metrics = ranking_metrics(scores, group, rank, k)
    assert metrics.has_pairs.tolist() == [True] * 6 + [False]
    assert metrics.exact[:6].tolist() == [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
    assert_close(metrics.kendall_tau[:6], torch.tensor([1.0, 1 / 3, -1.0, 1.0, 2 / 3, 1.0]))

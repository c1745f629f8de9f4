"""Reward-model ensemble aggregates and the bootstrap-weighted pair loss, against hand-worked values."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlhf_lit.functional import aggregate_scores, member_std, pairwise_reward_loss

torch.set_num_threads(1)

# Three responses scored by two members (columns).
#   row 0: 1, 3   mean 2, population std sqrt(((1-2)^2 + (3-2)^2) / 2) = 1, min 1
#   row 1: 2, 2   mean 2, std 0, min 2
#   row 2: -1, 5  mean 2, std sqrt((9 + 9) / 2) = 3, min -1
SCORES = torch.tensor([[1.0, 3.0], [2.0, 2.0], [-1.0, 5.0]])


def test_mean():
    assert_close(aggregate_scores(SCORES, "mean"), torch.tensor([2.0, 2.0, 2.0]))


def test_population_std():
    assert_close(
        member_std(SCORES), torch.tensor([1.0, 0.0, 3.0])
    )  # divisor M, not M - 1 (which gives sqrt(2), 0, sqrt(18))


def test_uncertainty_weighted_is_mean_minus_lambda_std():
    # 2 - 0.5 * (1, 0, 3) = 1.5, 2, 0.5: equal means, the disputed responses pay for the dispute
    assert_close(aggregate_scores(SCORES, "uncertainty_weighted", 0.5), torch.tensor([1.5, 2.0, 0.5]))
    assert_close(aggregate_scores(SCORES, "uncertainty_weighted", 0.0), torch.tensor([2.0, 2.0, 2.0]))


def test_worst_case_takes_each_rows_minimum():
    # the minimum is in column 0 for rows 0 and 2 and a tie in row 1; a row whose minimum sits in
    # column 1 checks that it is per row, not one member's column
    scores = torch.cat([SCORES, torch.tensor([[4.0, -2.0]])])
    assert_close(aggregate_scores(scores, "worst_case"), torch.tensor([1.0, 2.0, -1.0, -2.0]))


def test_identical_members_have_zero_std_and_every_aggregate_is_the_score():
    scores = torch.tensor([0.3, -1.7, 2.9]).unsqueeze(1).repeat(1, 4)  # (3, 4) four copies of one member
    assert torch.equal(member_std(scores), torch.zeros(3))
    for aggregate in ("mean", "uncertainty_weighted", "worst_case"):
        assert_close(aggregate_scores(scores, aggregate, 2.0), scores[:, 0])


def test_bad_arguments():
    with pytest.raises(ValueError, match="aggregate must be one of mean, uncertainty_weighted, worst_case"):
        aggregate_scores(SCORES, "median")
    with pytest.raises(ValueError, match="lambda must be >= 0"):
        aggregate_scores(SCORES, "uncertainty_weighted", -0.1)
    with pytest.raises(ValueError, match=r"\(B, M\)"):
        aggregate_scores(SCORES[:, 0], "mean")


# ---------------------------------------------------------------- pair loss with bootstrap weights
# chosen - rejected = 1, 0: losses log(1 + e^-1) = 0.31326168751822286 and log 2 = 0.6931471805599453
CHOSEN, REJECTED = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0])


def test_weighted_pair_loss_counts_each_pair_weight_times():
    loss, accuracy = pairwise_reward_loss(CHOSEN, REJECTED, weight=torch.tensor([2.0, 0.0]))
    assert_close(loss, torch.tensor(2 * 0.31326168751822286 / 2))  # mean over the 2 pairs of w * loss
    assert_close(accuracy, torch.tensor(0.5))  # accuracy is unweighted
    loss, _ = pairwise_reward_loss(CHOSEN, REJECTED, weight=torch.tensor([0.0, 3.0]))
    assert_close(loss, torch.tensor(3 * math.log(2) / 2))


def test_unit_weights_equal_the_plain_loss_bit_for_bit():
    plain, _ = pairwise_reward_loss(CHOSEN, REJECTED)
    weighted, _ = pairwise_reward_loss(CHOSEN, REJECTED, weight=torch.ones(2))
    assert torch.equal(plain, weighted)
    assert_close(plain, torch.tensor((0.31326168751822286 + 0.6931471805599453) / 2))


def test_weighted_pair_loss_gradcheck():
    gen = torch.Generator().manual_seed(0)
    chosen = torch.randn(5, dtype=torch.float64, generator=gen, requires_grad=True)
    rejected = torch.randn(5, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.tensor([0.0, 1.0, 2.0, 1.0, 3.0], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda c, r: pairwise_reward_loss(c, r, weight=weight)[0], (chosen, rejected))


def test_aggregate_gradcheck():
    # uncertainty_weighted is differentiable in the scores (a watchdog or a learned lambda may need it)
    scores = torch.randn(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    assert torch.autograd.gradcheck(lambda s: aggregate_scores(s, "uncertainty_weighted", 0.7), (scores,))

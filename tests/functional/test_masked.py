"""masked_mean / masked_var / masked_whiten / explained_variance against hand-worked values."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlhf_lit.functional import explained_variance, masked_mean, masked_var, masked_whiten

torch.set_num_threads(1)

T, F = True, False
INF = float("inf")

# Selected values are 1, 3 (row 0) and 5, 7 (row 1); masked-out slots hold garbage (inf, -50)
# that must not leak into any statistic.
X = torch.tensor([[1.0, 3.0, INF], [5.0, -50.0, 7.0]])
MASK = torch.tensor([[T, T, F], [T, F, T]])


def test_masked_mean_all_and_per_row():
    # (1 + 3 + 5 + 7) / 4 = 4
    assert_close(masked_mean(X, MASK), torch.tensor(4.0))
    # row 0: (1 + 3) / 2 = 2; row 1: (5 + 7) / 2 = 6
    assert_close(masked_mean(X, MASK, dim=1), torch.tensor([2.0, 6.0]))


def test_masked_var_biased_and_unbiased():
    # mean 4; deviations -3, -1, 1, 3; squares 9 + 1 + 1 + 9 = 20
    assert_close(masked_var(X, MASK, unbiased=False), torch.tensor(5.0))  # 20 / 4
    assert_close(masked_var(X, MASK), torch.tensor(20.0 / 3.0))  # Bessel: 20 / (4 - 1)


def test_masked_var_single_element():
    one = torch.tensor([[T, F, F], [F, F, F]])
    # population variance of the single value 1 is 0
    assert_close(masked_var(X, one, unbiased=False), torch.tensor(0.0))
    with pytest.raises(ValueError, match="at least 2"):
        masked_var(X, one, unbiased=True)


def test_masked_var_empty_mask_raises():
    with pytest.raises(ValueError, match="no True"):
        masked_var(X, torch.zeros(2, 3, dtype=torch.bool))


def test_masked_whiten_zero_mean_unit_variance():
    # mean 4, unbiased variance 20/3 -> (x - 4) / sqrt(20/3); masked-out slots are 0
    s = math.sqrt(20.0 / 3.0)
    expected = torch.tensor([[-3.0 / s, -1.0 / s, 0.0], [1.0 / s, 0.0, 3.0 / s]])
    assert_close(masked_whiten(X, MASK), expected)


def test_masked_whiten_keep_mean():
    # as above, plus the mean 4 on the counted slots only
    s = math.sqrt(20.0 / 3.0)
    expected = torch.tensor([[4 - 3.0 / s, 4 - 1.0 / s, 0.0], [4 + 1.0 / s, 0.0, 4 + 3.0 / s]])
    assert_close(masked_whiten(X, MASK, keep_mean=True), expected)


def test_masked_whiten_gradcheck():
    x = torch.tensor([[0.3, -1.2, 2.0, 0.7], [1.5, -0.4, 9.0, -2.2]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[T, T, F, T], [T, T, F, T]])
    assert torch.autograd.gradcheck(lambda v: masked_whiten(v, mask), (x,))
    assert torch.autograd.gradcheck(lambda v: masked_whiten(v, mask, keep_mean=True), (x,))


RETURNS = torch.tensor([[1.0, 3.0, 99.0], [5.0, 99.0, 7.0]])  # counted: 1, 3, 5, 7 (population var 5)


def test_explained_variance_partial():
    # residual returns - values on counted slots: 0, 2, 0, 2 -> mean 1, population variance 1
    # EV = 1 - 1 / 5 = 0.8
    values = torch.tensor([[1.0, 1.0, -7.0], [5.0, 42.0, 5.0]])
    assert_close(explained_variance(values, RETURNS, MASK), torch.tensor(0.8))


def test_explained_variance_worse_than_mean_is_negative():
    # residual: 1-7, 3-5, 5-3, 7-1 = -6, -2, 2, 6 -> variance (36 + 4 + 4 + 36) / 4 = 20
    # EV = 1 - 20 / 5 = -3
    values = torch.tensor([[7.0, 5.0, 0.0], [3.0, 0.0, 1.0]])
    assert_close(explained_variance(values, RETURNS, MASK), torch.tensor(-3.0))


def test_explained_variance_perfect_and_constant_returns():
    assert_close(explained_variance(RETURNS, RETURNS, MASK), torch.tensor(1.0))  # residual 0 -> 1 - 0/5
    constant = torch.full((2, 3), 2.0)
    # Var[returns] == 0: undefined, documented as NaN
    assert torch.isnan(explained_variance(torch.zeros(2, 3), constant, MASK))

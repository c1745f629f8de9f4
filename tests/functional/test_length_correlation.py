"""ODIN's length-disentangling terms (rlhf_lit/functional/length_correlation.py) against hand computations."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf_lit.functional.length_correlation import batch_pearson, head_orthogonality, length_correlation_loss


def test_pearson_of_a_hand_table():
    # x = 1..4, y = 2, 4, 5, 9: xc = -1.5 -0.5 0.5 1.5, yc = -3 -1 0 4;
    # sum xc*yc = 4.5 + 0.5 + 0 + 6 = 11, sum xc^2 = 5, sum yc^2 = 26 -> rho = 11 / sqrt(130)
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    y = torch.tensor([2.0, 4.0, 5.0, 9.0])
    assert batch_pearson(x, y).item() == pytest.approx(11 / math.sqrt(130), abs=1e-6)
    assert batch_pearson(x, -y).item() == pytest.approx(-11 / math.sqrt(130), abs=1e-6)
    # invariant to a positive affine change of either side (lengths in tokens or in hundreds)
    assert batch_pearson(3 * x - 7, y / 100 + 2).item() == pytest.approx(11 / math.sqrt(130), abs=1e-5)


def test_pearson_of_a_constant_is_zero_with_a_finite_gradient():
    x = torch.tensor([0.5, 0.5, 0.5], requires_grad=True)
    rho = batch_pearson(x, torch.tensor([1.0, 2.0, 4.0]))
    rho.backward()
    assert rho.item() == 0.0
    assert torch.isfinite(x.grad).all()


def test_pearson_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match=r"two \(N,\) vectors"):
        batch_pearson(torch.zeros(3), torch.zeros(4))


def test_correlation_loss_by_hand():
    lengths = torch.tensor([10.0, 20.0, 30.0, 40.0])
    quality = torch.tensor([1.0, 0.0, 0.0, 1.0])  # xc = .5 -.5 -.5 .5: sum xc*yc(-15,-5,5,15) = 0 -> rho 0
    length_score = torch.tensor([-2.0, -1.0, 0.0, 1.0])  # a line in the length: rho 1
    loss, rho_q, rho_l = length_correlation_loss(quality, length_score, lengths)
    assert rho_q.item() == pytest.approx(0.0, abs=1e-7)
    assert rho_l.item() == pytest.approx(1.0, abs=1e-6)
    assert loss.item() == pytest.approx(-1.0, abs=1e-6)  # the best the term can be
    # a quality head that tracks length, negatively or positively, is penalised by |rho| alike
    worst, rho_q, _ = length_correlation_loss(-length_score, -length_score, lengths)
    assert rho_q.item() == pytest.approx(-1.0, abs=1e-6)
    assert worst.item() == pytest.approx(1.0 + 1.0, abs=1e-6)  # |-1| - (-1)


def test_orthogonality_by_hand():
    assert head_orthogonality(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([1.0, 1.0, 0.0])).item() == pytest.approx(0.5)
    assert head_orthogonality(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([-2.0, -2.0, 0.0])).item() == pytest.approx(
        0.5
    )
    assert head_orthogonality(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 3.0])).item() == 0.0
    assert head_orthogonality(torch.tensor([1.0, 2.0]), torch.tensor([2.0, 4.0])).item() == pytest.approx(1.0)


def test_gradients_match_finite_differences():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(7, dtype=torch.float64, generator=generator, requires_grad=True)
    z = torch.randn(7, dtype=torch.float64, generator=generator, requires_grad=True)
    lengths = torch.randint(3, 50, (7,), generator=generator).double()
    assert torch.autograd.gradcheck(lambda a: batch_pearson(a, lengths), (x,))
    assert torch.autograd.gradcheck(lambda a, b: length_correlation_loss(a, b, lengths)[0], (x, z))
    w_q = torch.randn(5, dtype=torch.float64, generator=generator, requires_grad=True)
    w_l = torch.randn(5, dtype=torch.float64, generator=generator, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: head_orthogonality(a, b), (w_q, w_l))


def test_gradient_of_pearson_by_hand():
    # d rho / d x_i = (yc_i - rho * xc_i * |yc| / |xc|) / (|xc| |yc|), the closed form of Pearson's gradient
    x = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([2.0, 4.0, 5.0, 9.0], dtype=torch.float64)
    batch_pearson(x, y, eps=0.0).backward()
    xc = torch.tensor([-1.5, -0.5, 0.5, 1.5], dtype=torch.float64)
    yc = torch.tensor([-3.0, -1.0, 0.0, 4.0], dtype=torch.float64)
    rho = 11 / math.sqrt(130)
    expected = (yc - rho * xc * math.sqrt(26) / math.sqrt(5)) / (math.sqrt(5) * math.sqrt(26))
    torch.testing.assert_close(x.grad, expected)

"""The one signature every policy loss keeps (rlhf_lit/functional/policy_losses.py): a 0-dim loss
with a gradient through ``logprobs`` alone, nothing read off ``mask``, the statistics PPO logs.
Each variant's numbers are tested against hand-worked values beside it (``clipped``:
tests/functional/test_losses.py)."""

from __future__ import annotations

import pytest
import torch

from rlhf_lit.functional import POLICY_LOSSES

T, F = True, False
LOGGED_STATS = {"clipfrac", "approx_kl", "ratio_mean"}  # read by the PPO loss as policy/clipfrac, approxkl, ratio
OLD = torch.tensor([[-1.0, -2.0, -0.5, -0.7], [-1.5, -1.0, -2.0, -0.2]])
NEW = OLD + torch.tensor([[0.5, 0.05, -0.5, 0.1], [-0.1, 0.3, 0.0, -0.4]])
ADV = torch.tensor([[1.0, -2.0, 0.5, 1.5], [0.7, -0.3, 1.2, -1.0]])
MASK = torch.tensor([[T, T, T, F], [T, T, F, F]])


def _off_mask(x: torch.Tensor, garbage: float) -> torch.Tensor:
    return torch.where(MASK, x, torch.full_like(x, garbage))


@pytest.mark.parametrize("kind", sorted(POLICY_LOSSES))
def test_a_policy_loss_keeps_the_signature_contract(kind):
    fn = POLICY_LOSSES[kind]
    logprobs = NEW.clone().requires_grad_(True)
    loss, stats = fn(logprobs, OLD, ADV, MASK, 0.2)
    assert loss.dim() == 0 and loss.requires_grad
    assert LOGGED_STATS <= set(stats)
    assert all(v.dim() == 0 and not v.requires_grad for v in stats.values())
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert (grad[~MASK] == 0).all() and (grad[MASK] != 0).any()
    # What lies off the mask (padding, tokens after EOS) changes neither the loss nor a statistic.
    moved, moved_stats = fn(_off_mask(NEW, 3.0), _off_mask(OLD, -7.0), _off_mask(ADV, 100.0), MASK, 0.2)
    assert torch.equal(moved, loss.detach())
    assert {k: v.item() for k, v in moved_stats.items()} == {k: v.item() for k, v in stats.items()}

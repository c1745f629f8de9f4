"""gae against hand-worked rows (gamma=0.5, lam=0.25, so gamma * lam = 0.125)."""

import torch
from torch.testing import assert_close

from rlhf_lit.functional import gae

torch.set_num_threads(1)

T, F = True, False
NAN = float("nan")
GAMMA, LAM = 0.5, 0.25

# Row 0: valid 0..2, padding at 3. Row 1: prompt at 0..1 masked out, valid 2..3.
REWARDS = torch.tensor([[1.0, 0.0, 2.0, 50.0], [9.0, -7.0, 0.5, -1.0]])
VALUES = torch.tensor([[0.5, 1.0, -1.0, 80.0], [3.0, 4.0, 2.0, 1.0]])
MASK = torch.tensor([[T, T, T, F], [F, F, T, T]])

# Row 0 backwards (value after the last valid slot is 0):
#   t=2: delta = 2 + 0.5*0 - (-1) = 3                 A = 3
#   t=1: delta = 0 + 0.5*(-1) - 1 = -1.5              A = -1.5 + 0.125*3 = -1.125
#   t=0: delta = 1 + 0.5*1 - 0.5 = 1                  A = 1 + 0.125*(-1.125) = 0.859375
# Row 1 backwards:
#   t=3: delta = -1 + 0 - 1 = -2                      A = -2
#   t=2: delta = 0.5 + 0.5*1 - 2 = -1                 A = -1 + 0.125*(-2) = -1.25
EXPECTED_ADV = torch.tensor([[0.859375, -1.125, 3.0, 0.0], [0.0, 0.0, -1.25, -2.0]])
# returns = A + V on valid slots, 0 elsewhere
EXPECTED_RET = torch.tensor([[1.359375, -0.125, 2.0, 0.0], [0.0, 0.0, 0.75, -1.0]])


def test_gae_hand_worked_rows():
    advantages, returns = gae(REWARDS, VALUES, MASK, GAMMA, LAM)
    assert_close(advantages, EXPECTED_ADV)
    assert_close(returns, EXPECTED_RET)


def test_gae_padding_and_prompt_offset_do_not_change_valid_advantages():
    # Row 0 of the batch above on its own, exact length 3 ...
    short_adv, _ = gae(REWARDS[:1, :3], VALUES[:1, :3], torch.ones(1, 3, dtype=torch.bool), GAMMA, LAM)
    assert_close(short_adv, torch.tensor([[0.859375, -1.125, 3.0]]))
    # ... and padded with a 2-slot prompt in front and 3 slots of garbage (incl. NaN) behind it.
    rewards = torch.tensor([[NAN, 1e6, 1.0, 0.0, 2.0, 1e6, NAN, -1e6]])
    values = torch.tensor([[-1e6, NAN, 0.5, 1.0, -1.0, NAN, 1e6, 7.0]])
    mask = torch.tensor([[F, F, T, T, T, F, F, F]])
    advantages, returns = gae(rewards, values, mask, GAMMA, LAM)
    assert_close(advantages[:, 2:5], short_adv)
    assert_close(advantages, torch.tensor([[0.0, 0.0, 0.859375, -1.125, 3.0, 0.0, 0.0, 0.0]]))
    assert_close(returns, torch.tensor([[0.0, 0.0, 1.359375, -0.125, 2.0, 0.0, 0.0, 0.0]]))


def test_gae_empty_row_is_zero():
    advantages, returns = gae(REWARDS, VALUES, torch.zeros(2, 4, dtype=torch.bool), GAMMA, LAM)
    assert_close(advantages, torch.zeros(2, 4))
    assert_close(returns, torch.zeros(2, 4))

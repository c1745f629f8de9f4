"""Preference pairs as one batch, and score shaping, against values worked out by hand."""

import pytest
import torch

from rlhf_lit.functional import concat_pairs, shape_scores


def test_pairs_are_chosen_rows_then_rejected_rows_right_padded_to_the_longer():
    chosen = torch.tensor([[5, 6, 7], [8, 9, 0]])
    chosen_mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    rejected = torch.tensor([[5, 6, 7, 4, 3], [8, 1, 0, 0, 0]])
    rejected_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    ids, mask = concat_pairs(chosen, chosen_mask, rejected, rejected_mask, pad_id=99)
    assert ids.tolist() == [[5, 6, 7, 99, 99], [8, 9, 0, 99, 99], [5, 6, 7, 4, 3], [8, 1, 0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]


def test_shaping_applies_bias_whitening_clip_and_penalty_in_that_order():
    raw = torch.tensor([3.0, 1.0, 2.0])
    ended = torch.tensor([True, True, False])
    assert shape_scores(raw, ended).tolist() == [3.0, 1.0, 2.0]
    assert shape_scores(raw, ended, bias=1.0).tolist() == [2.0, 0.0, 1.0]
    # bias 1 -> [2, 0, 1]: mean 1, unbiased std 1 -> whitened [1, -1, 0] (std + 1e-8 in the denominator)
    whitened = shape_scores(raw, ended, bias=1.0, whiten="scores")
    assert whitened.tolist() == pytest.approx([1.0, -1.0, 0.0], rel=1e-6, abs=1e-7)
    clipped = shape_scores(raw, ended, bias=1.0, whiten="scores", clip=0.5)
    assert clipped.tolist() == pytest.approx([0.5, -0.5, 0.0], rel=1e-6, abs=1e-7)
    # the penalty replaces the score of the response without EOS (row 2), after everything else
    penalised = shape_scores(raw, ended, bias=1.0, whiten="scores", clip=0.5, missing_eos_penalty=-3.0)
    assert penalised.tolist() == pytest.approx([0.5, -0.5, -3.0], rel=1e-6)
    # "rewards" whitening happens after the KL shaping, not here
    assert shape_scores(raw, ended, whiten="rewards").tolist() == [3.0, 1.0, 2.0]

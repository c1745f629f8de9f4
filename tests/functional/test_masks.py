"""response_mask_from_eos and last_true_index."""

import pytest
import torch
from torch.testing import assert_close

from rlhf_lit.functional import last_true_index, response_mask_from_eos

torch.set_num_threads(1)

T, F = True, False


def test_response_mask_single_eos():
    ids = torch.tensor(
        [
            [2, 5, 6, 7],  # EOS first
            [5, 2, 6, 2],  # EOS in the middle (the second EOS changes nothing)
            [5, 6, 7, 2],  # EOS last
            [5, 6, 7, 8],  # no EOS
        ]
    )
    mask, ended = response_mask_from_eos(ids, eos_token_id=2)
    expected = torch.tensor([[T, F, F, F], [T, T, F, F], [T, T, T, T], [T, T, T, T]])
    assert_close(mask, expected)
    assert_close(ended, torch.tensor([T, T, T, F]))


def test_response_mask_several_eos_ids():
    ids = torch.tensor([[5, 9, 2, 6], [5, 6, 2, 9], [9, 9, 9, 9], [5, 6, 7, 8]])
    mask, ended = response_mask_from_eos(ids, eos_token_id=[2, 9])
    expected = torch.tensor([[T, T, F, F], [T, T, T, F], [T, F, F, F], [T, T, T, T]])
    assert_close(mask, expected)
    assert_close(ended, torch.tensor([T, T, T, F]))
    mask, ended = response_mask_from_eos(ids, eos_token_id=(9,))
    assert_close(mask, torch.tensor([[T, T, F, F], [T, T, T, T], [T, F, F, F], [T, T, T, T]]))
    assert_close(ended, torch.tensor([T, T, T, F]))
    with pytest.raises(ValueError, match="non-empty"):
        response_mask_from_eos(ids, eos_token_id=[])


def test_last_true_index():
    mask = torch.tensor([[T, T, F, F], [F, T, T, T], [F, F, F, F], [F, T, F, T]])
    out = last_true_index(mask)
    assert out.dtype == torch.long
    assert_close(out, torch.tensor([1, 3, -1, 3]))  # empty row -> -1, never 0

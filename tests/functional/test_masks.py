"""response_mask_from_eos, last_true_index, attended_span and length_groups."""

import pytest
import torch
from torch.testing import assert_close

from rlhf_lit.functional import (
    append_eos_to_unfinished,
    attended_span,
    last_true_index,
    length_groups,
    response_mask_from_eos,
)

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


def test_append_eos_to_unfinished_ends_only_the_rows_without_eos():
    eos, pad = 2, 0
    # Left-padded prompts, responses right-padded after their EOS; rows 1 and 3 never ended.
    ids = torch.tensor(
        [
            [0, 7, 8, 5, 2, 0],  # ended early: EOS at column 4, pad after it
            [7, 8, 9, 5, 6, 4],  # cut at max_new_tokens
            [0, 0, 7, 5, 6, 2],  # ended at the last column
            [0, 7, 9, 5, 6, 4],  # cut, left-padded prompt
        ]
    )
    mask = torch.tensor([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]])
    ended = torch.tensor([T, F, T, F])
    new_ids, new_mask = append_eos_to_unfinished(ids, mask, ended, eos, pad)
    # The new column: pad (masked) where the row ended, EOS (attended) where it was cut.
    assert_close(new_ids[:, :6], ids)
    assert_close(new_mask[:, :6], mask)
    assert_close(new_ids[:, 6], torch.tensor([0, 2, 0, 2]))
    assert_close(new_mask[:, 6], torch.tensor([0, 1, 0, 1]))
    # Every row's last real token is now an EOS: columns 4, 6, 5, 6.
    last = last_true_index(new_mask.bool())
    assert_close(last, torch.tensor([4, 6, 5, 6]))
    assert new_ids.gather(1, last[:, None]).squeeze(1).tolist() == [eos] * 4


def _left_padded(lengths: list[int], width: int) -> torch.Tensor:
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, width - length :] = 1
    return mask


def test_attended_span_keeps_a_prompt_and_a_response_column():
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 0]])  # P = 4: prompts from column 2, responses end at 4
    assert attended_span(mask, 4) == (2, 5)
    nothing = torch.zeros(2, 6, dtype=torch.long)
    assert attended_span(nothing, 4) == (3, 5)  # the last prompt column and the first response column


def test_length_groups_by_hand():
    # Eight rows of 14..17 + 48 tokens and one of 48 + 48 in 64 + 48 columns: apart, 7 x 65 + 96 = 551
    # positions against 8 x 96 = 768 (28% fewer); the split after the 7th shortest row is the best.
    lengths = [13 + 48, 15 + 48, 13 + 48, 48 + 48, 14 + 48, 15 + 48, 14 + 48, 17 + 48]
    groups = length_groups(_left_padded(lengths, 112))
    assert [g.tolist() for g in groups] == [[0, 2, 4, 6, 1, 5, 7], [3]]
    # Lengths 10, 11, 12, 13: apart at best 3 x 12 + 13 = 49 of 52 positions (6%): one group.
    assert [g.tolist() for g in length_groups(_left_padded([10, 11, 12, 13], 20))] == [[0, 1, 2, 3]]
    # Two short and two long rows: 2 x 5 + 2 x 20 = 50 of 80 (38%), split in the middle.
    assert [g.tolist() for g in length_groups(_left_padded([20, 5, 20, 5], 20))] == [[1, 3], [0, 2]]
    # The threshold: the same batch kept whole when 40% must be saved.
    assert len(length_groups(_left_padded([20, 5, 20, 5], 20), min_saving=0.4)) == 1

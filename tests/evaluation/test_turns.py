"""A response that writes another turn's role markers is flagged: by a special token in its ids or a
role line in its text; the EOS that ends it and the padding after it never count."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from rlhf_lit.evaluation.turns import holds_other_turn, marker_token_ids

EOS, PAD, IM_START = 2, 0, 1


def test_marker_ids_are_the_special_tokens_that_do_not_end_a_response():
    tokenizer = SimpleNamespace(all_special_ids=[0, 1, 2, 7], pad_token_id=PAD)
    assert marker_token_ids(tokenizer, stop_ids=(EOS,)) == {IM_START, 7}


def test_a_role_token_or_a_role_line_marks_another_turn_and_eos_or_padding_do_not():
    ids = torch.tensor(
        [
            [5, 6, EOS, PAD],  # ends cleanly
            [5, IM_START, 6, 6],  # opens a new turn with the template's token
            [5, 6, 6, 6],  # text only: a "User:" line
            [5, EOS, IM_START, IM_START],  # the marker lies after EOS: not the response's
            [5, 6, 6, 6],  # mentions a user mid-line: no role line
        ]
    )
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    texts = ["Sure, here it is.", "Sure", "Sure.\nUser: and now?", "No", "A user: asked this"]
    assert holds_other_turn(texts, ids, mask, {IM_START}) == [False, True, True, False, False]
    assert holds_other_turn(["ok", "\n  Human: hi"], ids[:2, :1], mask[:2, :1], {IM_START}) == [False, True]

"""Response texts: cut at the first EOS by position, without special tokens, leading space kept."""

from __future__ import annotations

import torch

from rlhf_lit.evaluation import response_texts
from rlhf_lit.tokenizer import load_tokenizer

EOS, PAD = 2, 0  # stories260K: eos 2, pad = <unk> 0


def test_response_texts_cut_at_eos_by_position_keep_leading_space(stories_path):
    tokenizer = load_tokenizer(stories_path, padding_side="left")
    # stories260K ids: <s>=1, ▁Once 403 ▁upon 407 ▁a 261 ▁time 378 | ▁The 291 ▁c 280 at 294 |
    # ▁happy 393 | ▁there 383 ▁was 286 ▁do 400 g 428 | ▁s 262 . 426. Prompts left padded to P = 5.
    query_responses = torch.tensor(
        [
            [1, 403, 407, 261, 378, 383, 286, 261, 400, 428],  # no EOS: all five response tokens
            [PAD, 1, 291, 280, 294, 262, 294, 426, EOS, 383],  # a real word (▁there) after EOS: dropped
            [PAD, PAD, PAD, 1, 393, EOS, 383, 286, PAD, PAD],  # EOS first: empty response
        ]
    )
    attention_mask = torch.tensor([[1] * 10, [0, 1, 1, 1, 1, 1, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1, 0, 0, 0, 0]])
    response_mask = torch.tensor([[True] * 5, [True] * 4 + [False], [True] + [False] * 4])
    ended = torch.tensor([False, True, True])
    texts = response_texts(tokenizer, query_responses, attention_mask, response_mask, ended)
    # "Once upon a time there was a dog" minus "Once upon a time": the leading space survives
    # (decoding the response ids alone gives "there was a dog"); no <s>, </s> or <unk> text.
    assert texts == [" there was a dog", " sat.", ""]

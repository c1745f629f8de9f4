"""Whether a response stays in its own turn: a chat policy that writes another turn's role markers
(a template's role token such as ``<|im_start|>``, or a ``Human:`` / ``User:`` line) has left the
chat format, a failure RLHF can teach and a judge of the reply's text alone does not see."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

import torch

ROLE_LINE = re.compile(r"^\s*(Human|User|Assistant|System)\s*:", re.IGNORECASE | re.MULTILINE)
"""A line that opens a turn the way transcripts write it (HH-RLHF's ``Human:`` / ``Assistant:``)."""


def marker_token_ids(tokenizer, stop_ids: Collection[int]) -> set[int]:
    """The ids of the tokenizer's special tokens other than the ones that end a response (``stop_ids``)
    and the pad: in a chat model's reply they can only open or mark another turn."""
    ids = set(getattr(tokenizer, "all_special_ids", ()))
    return ids - set(stop_ids) - {tokenizer.pad_token_id}


def holds_other_turn(
    texts: Sequence[str], response_ids: torch.Tensor, response_mask: torch.Tensor, marker_ids: Collection[int]
) -> list[bool]:
    """Per response: True when its ids hold one of ``marker_ids`` or its text a role line (:data:`ROLE_LINE`).

    Args:
        texts: the decoded responses (:func:`rlhf_lit.evaluation.response_texts`), ``B`` strings.
        response_ids: ``(B, R)`` generated ids.
        response_mask: ``(B, R)`` bool, True up to and including the first EOS (an EOS is never a marker).
        marker_ids: :func:`marker_token_ids`.
    """
    markers = torch.tensor(sorted(marker_ids), dtype=response_ids.dtype, device=response_ids.device)  # (M,)
    by_token = (torch.isin(response_ids, markers) & response_mask).any(1).tolist()  # (B,)
    return [token or bool(ROLE_LINE.search(text)) for token, text in zip(by_token, texts)]

"""Preference pairs as one batch: chosen rows then rejected rows, padded to one length (:func:`batch_sequences`
reads a preference batch so)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F


def pad_ids(
    seqs: Sequence[Sequence[int]], value: int, side: Literal["right", "left"], length: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad lists of ids to one length (the longest, or ``length``), on the right or the left.

    Returns:
        ``(ids, attention_mask)``, both ``(B, T)`` long; the mask is 1 on the given tokens.
    """
    length = max(len(s) for s in seqs) if length is None else length
    ids = torch.full((len(seqs), length), value, dtype=torch.long)  # (B, T)
    mask = torch.zeros((len(seqs), length), dtype=torch.long)  # (B, T)
    for i, s in enumerate(seqs):
        cols = slice(0, len(s)) if side == "right" else slice(length - len(s), length)
        ids[i, cols] = torch.as_tensor(s, dtype=torch.long)
        mask[i, cols] = 1
    return ids, mask


def pad_right(x: torch.Tensor, length: int, value: int) -> torch.Tensor:
    """Right-pad ``(B, T)`` to ``(B, length)`` with ``value``."""
    return F.pad(x, (0, length - x.shape[1]), value=value)  # (B, length)


def concat_pairs(
    chosen_ids: torch.Tensor,
    chosen_mask: torch.Tensor,
    rejected_ids: torch.Tensor,
    rejected_mask: torch.Tensor,
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chosen then rejected rows as one ``(2B, T)`` batch (``T`` the longer of the two), so a pair
    goes through a model in one forward pass.

    Args:
        chosen_ids, chosen_mask: ``(B, Tc)`` right-padded chosen sequences and their attention mask.
        rejected_ids, rejected_mask: ``(B, Tr)`` the same for the rejected sequences.
        pad_id: the id written into the added padding (never read: positions come from the masks).

    Returns:
        ``input_ids (2B, T)`` and ``attention_mask (2B, T)``; rows ``[:B]`` chosen, ``[B:]`` rejected.
    """
    T = max(chosen_ids.shape[1], rejected_ids.shape[1])
    input_ids = torch.cat([pad_right(chosen_ids, T, pad_id), pad_right(rejected_ids, T, pad_id)])  # (2B, T)
    attention_mask = torch.cat([pad_right(chosen_mask, T, 0), pad_right(rejected_mask, T, 0)])  # (2B, T)
    return input_ids, attention_mask


def batch_sequences(batch: dict[str, torch.Tensor], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every sequence of a preference batch as one ``(N, T)`` batch: the chosen rows then the
    rejected rows (``N = 2B``, :func:`concat_pairs`), so each response goes through a model once, in one
    forward. A ranking batch (or a reference batch of sequences) is already one: its ``input_ids`` and
    ``attention_mask`` as they are."""
    if "chosen_input_ids" not in batch:
        return batch["input_ids"], batch["attention_mask"]  # (N, T) x2
    halves = [batch[f"{side}_{key}"] for side in ("chosen", "rejected") for key in ("input_ids", "attention_mask")]
    # Padding values never matter: scores and logprobs are read through the attention mask.
    return concat_pairs(*halves, pad_token_id)  # (2B, T) x2

"""Masks and indices for generated responses."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def response_mask_from_eos(
    response_ids: torch.Tensor, eos_token_id: int | Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which generated tokens belong to the response: everything up to and including the first EOS.

    The pad id may equal the EOS id, so the mask is built from the first EOS, never from pad ids.

    Args:
        response_ids: ``(B, R)`` generated token ids (prompt removed).
        eos_token_id: one id or several (any of them ends a response).

    Returns:
        ``(mask, ended)``: ``mask (B, R)`` bool, True up to and including the first EOS (all True
        for a row without EOS); ``ended (B,)`` bool, True where the row contains an EOS.
    """
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    if not ids:
        raise ValueError("eos_token_id must be an int or a non-empty sequence of ints.")
    eos = torch.tensor(ids, dtype=response_ids.dtype, device=response_ids.device)  # (E,)
    is_eos = torch.isin(response_ids, eos)  # (B, R)
    # Number of EOS tokens strictly before each position; the first EOS itself still counts.
    eos_before = torch.cumsum(is_eos.long(), dim=-1) - is_eos.long()  # (B, R)
    mask = eos_before == 0  # (B, R)
    ended = is_eos.any(dim=-1)  # (B,)
    return mask, ended


def last_true_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last True position along the last dim.

    Args:
        mask: bool ``(B, T)``.

    Returns:
        ``(B,)`` long; -1 for a row with no True (so it never silently aliases position 0;
        ``arange(T) == -1`` matches nothing, which callers use to skip such rows).
    """
    positions = torch.arange(mask.shape[-1], device=mask.device)  # (T,)
    minus_one = torch.full((), -1, dtype=positions.dtype, device=mask.device)  # ()
    return torch.where(mask, positions, minus_one).amax(dim=-1)  # (B,)


def response_mask_from_prompt_length(attention_mask: torch.Tensor, prompt_lengths: torch.Tensor) -> torch.Tensor:
    """Which positions hold response tokens: the real tokens after each row's first ``prompt_length``.

    Counted over real tokens only (``cumsum(attention_mask) - 1`` is a token's index in its row),
    so left and right padding give the same tokens.

    Args:
        attention_mask: ``(B, T)``, 1 (True) on real tokens.
        prompt_lengths: ``(B,)`` number of prompt tokens of each row (including a BOS prefix).

    Returns:
        bool ``(B, T)``, True on response tokens.
    """
    real = attention_mask.bool()  # (B, T)
    index = real.long().cumsum(dim=-1) - 1  # (B, T) index of each real token in its row
    return real & (index >= prompt_lengths.unsqueeze(-1))  # (B, T)


def append_eos_to_unfinished(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, ended: torch.Tensor, eos_token_id: int, pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One column more: EOS on the rows whose response never ended, a masked pad on the others.

    A response cut at ``max_new_tokens`` has a real token in its last column (it never stopped),
    so the EOS lands right after its last token; a row that ended keeps its own EOS as its last
    real token, and its new column is padding. Reading a score at the last real token then reads
    every row at an EOS, the way a reward model trained on EOS-terminated responses was trained.

    Args:
        input_ids: ``(B, T)`` prompt + response ids (responses right-padded after their EOS).
        attention_mask: ``(B, T)``, 1 on real tokens.
        ended: ``(B,)`` bool, the response holds an EOS.
        eos_token_id: the id appended to unfinished rows.
        pad_token_id: the id of the new column on rows that ended (masked out).

    Returns:
        ``(input_ids, attention_mask)``, both ``(B, T + 1)``.
    """
    eos = torch.full_like(input_ids[:, 0], eos_token_id)  # (B,)
    pad = torch.full_like(input_ids[:, 0], pad_token_id)  # (B,)
    column_ids = torch.where(ended, pad, eos)  # (B,)
    column_mask = (~ended).to(attention_mask.dtype)  # (B,)
    ids = torch.cat([input_ids, column_ids.unsqueeze(1)], dim=1)  # (B, T + 1)
    mask = torch.cat([attention_mask, column_mask.unsqueeze(1)], dim=1)  # (B, T + 1)
    return ids, mask


def attended_span(attention_mask: torch.Tensor, prompt_length: int) -> tuple[int, int]:
    """The columns some row attends, ``[first, stop)``: what is left of a left-padded prompt + response
    batch once the padding no row needs is cut (one host read).

    ``first`` is the first column any row attends, at most ``prompt_length - 1`` (the last prompt
    column predicts the first response token, so one is always kept); ``stop`` is one past the last
    column any row attends, at least ``prompt_length + 1`` (one response column is kept). Cutting
    the other columns changes no output on the kept ones beyond the order of float sums: padding
    keys are masked out, and positions come from the mask, not the column index.

    Args:
        attention_mask: ``(B, T)``, 1 (True) on real tokens; prompt in columns ``< prompt_length``.
        prompt_length: P, the prompt columns.
    """
    attended = attention_mask.bool().any(dim=0)  # (T,)
    columns = torch.nonzero(attended).flatten().tolist()  # the one host read
    if not columns:
        return prompt_length - 1, min(prompt_length + 1, attention_mask.shape[1])
    first = min(columns[0], prompt_length - 1)
    stop = max(columns[-1] + 1, min(prompt_length + 1, attention_mask.shape[1]))
    return first, stop


GROUP_SAVING = 0.2
"""The least share of a batch's padded positions that splitting it in two must save (:func:`length_groups`):
below it one pass over the padded rows costs less than two smaller ones."""


def length_groups(attention_mask: torch.Tensor, min_saving: float = GROUP_SAVING) -> list[torch.Tensor]:
    """The rows of a left-padded batch in one or two groups by length, so that passes over each group
    without the padding none of its rows attends cost less than one pass over all rows (one host read).

    A row's length counts from its first attended column to the end (its prompt's real tokens and
    every response column). The rows are sorted by length and split where the positions left,
    ``k * (k-th length) + (B - k) * (longest)``, are fewest; the split is taken when it saves at
    least ``min_saving`` of ``B * longest`` (one long prompt among short ones: seven rows of 13 to 17
    + 48 tokens and one of 48 + 48 go from 768 positions to 551), else all rows are one group.

    Args:
        attention_mask: ``(B, T)``, 1 (True) on real tokens, prompts left-padded.
        min_saving: the least saving, a share of the padded positions.

    Returns:
        One or two ``(M,)`` CPU long tensors of row indices (the short rows first), together every row once.
    """
    rows, total = attention_mask.shape
    attended = attention_mask.bool().cpu()  # (B, T)
    first = torch.where(attended.any(dim=1), attended.long().argmax(dim=1), total - 1)  # (B,)
    lengths = total - first  # (B,)
    order = torch.argsort(lengths, stable=True)  # (B,) shortest first
    sorted_lengths = lengths[order].tolist()
    longest = sorted_lengths[-1]
    best, split = rows * longest, 0
    for k in range(1, rows):  # the first k rows (up to the k-th length) apart from the rest
        cost = k * sorted_lengths[k - 1] + (rows - k) * longest
        if cost < best:
            best, split = cost, k
    if split == 0 or best > (1.0 - min_saving) * rows * longest:
        return [torch.arange(rows)]
    return [order[:split], order[split:]]

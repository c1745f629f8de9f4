"""Padding and collate functions (batch formats in docs/CONTRACTS.md).

SFT, preference and ranking batches are right padded, prompt batches left padded (generation appends on
the right). Padding uses the tokenizer's ``pad_token_id``; which positions are real is carried by
``attention_mask`` (never recomputed from ``input_ids != pad_token_id``: the pad may equal EOS).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlhf_lit.functional.losses import IGNORE_INDEX
from rlhf_lit.functional.pairs import pad_ids as pad


def require_pad_id(tokenizer: Any) -> int:
    """``tokenizer.pad_token_id``, or a clear error when it has none."""
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        raise ValueError(
            "the tokenizer has no pad token; load it with rlhf_lit.tokenizer.load_tokenizer "
            "(missing_pad='add' or 'eos') or set tokenizer.pad_token"
        )
    return int(pad_id)


@dataclass(frozen=True)
class SequenceCollator:
    """Items ``{"input_ids", ...}`` -> right padded ``input_ids`` and ``attention_mask`` ``(B, T)``
    only (whole sequences to be scored, e.g. the reward-normalisation reference set)."""

    pad_token_id: int

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        input_ids, attention_mask = pad([x["input_ids"] for x in items], self.pad_token_id, "right")
        return {"input_ids": input_ids, "attention_mask": attention_mask}


@dataclass(frozen=True)
class SFTCollator(SequenceCollator):
    """Items ``{"input_ids", "labels"}`` -> right padded ``input_ids``, ``attention_mask``,
    ``labels`` (-100 on padding; the items already hold -100 on the prompt)."""

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        labels, _ = pad([x["labels"] for x in items], IGNORE_INDEX, "right")
        return {**super().__call__(items), "labels": labels}


@dataclass(frozen=True)
class PreferenceCollator:
    """Items ``{"chosen_input_ids", "rejected_input_ids"[, "prompt_length"][, "margin"][, "extras"]}`` -> right
    padded chosen and rejected ids and masks, all ``(B, T)`` with one common T, plus
    ``prompt_length (B,)`` long and ``margin (B,)`` float when the items have them, and extra columns as
    ``extras``, a dict of plain lists (``{name: [B values]}``, as :class:`PromptCollator`'s)."""

    pad_token_id: int

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        chosen = [x["chosen_input_ids"] for x in items]
        rejected = [x["rejected_input_ids"] for x in items]
        length = max(len(s) for s in chosen + rejected)
        c_ids, c_mask = pad(chosen, self.pad_token_id, "right", length)
        r_ids, r_mask = pad(rejected, self.pad_token_id, "right", length)
        batch: dict[str, Any] = {
            "chosen_input_ids": c_ids,
            "chosen_attention_mask": c_mask,
            "rejected_input_ids": r_ids,
            "rejected_attention_mask": r_mask,
        }
        if "prompt_length" in items[0]:
            batch["prompt_length"] = torch.tensor([x["prompt_length"] for x in items], dtype=torch.long)  # (B,)
        if "margin" in items[0]:
            batch["margin"] = torch.tensor([x["margin"] for x in items], dtype=torch.float)  # (B,)
        if "extras" in items[0]:
            batch["extras"] = {name: [x["extras"][name] for x in items] for name in items[0]["extras"]}
        return batch


@dataclass(frozen=True)
class RankingCollator:
    """Ranking items ``{"input_ids": [K_b lists], "rank": [K_b ints], "prompt_length"}`` -> one
    right padded batch of every response (docs/CONTRACTS.md, "Ranking batch"):

    - ``input_ids``, ``attention_mask`` ``(N, T)``, ``N = sum K_b``, T the longest row; rows
      POSITION-MAJOR: the first response of every prompt (in prompt order), then the second of every
      prompt that has one, and so on. For K = 2 these are the pair batch's chosen rows then its
      rejected rows (``concat_pairs``), so pair results carry over bit for bit.
    - ``group (N,)``: the row's prompt, 0..B-1; ``rank (N,)``: its rank in that prompt (0 = best,
      equal = tie); ``prompt_length (N,)``: its prompt tokens.
    - ``responses_per_prompt (B,)``: K_b of each prompt.
    """

    pad_token_id: int

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        K = [len(x["input_ids"]) for x in items]
        rows = [(b, k) for k in range(max(K)) for b in range(len(items)) if k < K[b]]  # position-major
        input_ids, attention_mask = pad([items[b]["input_ids"][k] for b, k in rows], self.pad_token_id, "right")
        return {
            "input_ids": input_ids,  # (N, T)
            "attention_mask": attention_mask,  # (N, T)
            "group": torch.tensor([b for b, _ in rows], dtype=torch.long),  # (N,)
            "rank": torch.tensor([items[b]["rank"][k] for b, k in rows], dtype=torch.long),  # (N,)
            "responses_per_prompt": torch.tensor(K, dtype=torch.long),  # (B,)
            "prompt_length": torch.tensor([items[b]["prompt_length"] for b, _ in rows], dtype=torch.long),  # (N,)
        }


@dataclass(frozen=True)
class PromptCollator:
    """Items ``{"input_ids", "index"[, "extras"]}`` -> left padded ``input_ids``, ``attention_mask``,
    ``index (B,)``, the dataset row of each prompt, and with extra columns ``extras``: a dict of
    plain lists (``{name: [B values]}``; strings stay strings, never collated into tensors)."""

    pad_token_id: int

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        input_ids, attention_mask = pad([x["input_ids"] for x in items], self.pad_token_id, "left")
        index = torch.tensor([x["index"] for x in items], dtype=torch.long)  # (B,)
        batch: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask, "index": index}
        if "extras" in items[0]:
            batch["extras"] = {name: [x["extras"][name] for x in items] for name in items[0]["extras"]}
        return batch

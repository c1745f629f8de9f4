"""Preference data: (prompt, chosen, rejected[, margin]) -> right padded chosen and rejected
sequences for the reward model."""

from __future__ import annotations

from typing import Any, Literal

from torch.utils.data import DataLoader

from rlhf_lit.data.adapters import Example, Fields
from rlhf_lit.data.base import TextDataModule
from rlhf_lit.data.collate import PreferenceCollator
from rlhf_lit.data.encoding import TextEncoder, truncate_prompt, truncate_response


class PreferenceDataModule(TextDataModule):
    """Pairwise preferences for reward-model training.

    Batches (right padded, chosen and rejected to one common T): ``chosen_input_ids``,
    ``chosen_attention_mask``, ``rejected_input_ids``, ``rejected_attention_mask`` ``(B, T)``,
    and ``margin (B,)`` float when ``fields.margin`` is set.

    Each sequence is prompt + response + EOS with the SFT truncation rule: the shared prompt is
    truncated from the LEFT to ``max_prompt_length``, each response from the right so that the
    sequence has at most ``max_length`` tokens; a cut response gets no EOS. A pair where either
    response keeps no token is dropped, counted and logged once.

    Args:
        tokenizer: Hugging Face tokenizer; set by the CLI from the model stage (must have a pad
            token). Required by ``setup``.
        train_path: training data: a local file (.jsonl, .json, optionally .gz) if it exists,
            else a Hugging Face hub dataset name (needs ``pip install 'rlhf-lit[hub]'``). A
            path-like string that does not exist is an error, never a hub lookup.
        val_path: validation data from a separate source (same rules as ``train_path``).
        val_fraction: else hold out this fraction of the training pairs (seeded by ``seed``);
            0 means no validation. Giving it together with ``val_path`` is an error.
        seed: seed of the validation split and of the training shuffle.
        format: record format: ``fields`` (prompt/chosen/rejected[/margin] columns named by
            ``fields``) or ``hh_rlhf`` (transcripts split at the last ``\\n\\nAssistant:``; pairs
            that do not share the prompt are skipped and counted).
        fields: column names (``fields`` format; ``hh_rlhf`` reads ``chosen``/``rejected``).
        split: hub split to read.
        subset: hub dataset configuration (subset) name.
        max_records: read at most this many records per source (None: all).
        skip_invalid: skip (and count, log once) lines that do not parse and records with a
            missing, non-string or empty field, instead of raising.
        apply_chat_template: render the prompt as a user turn and each response as the
            assistant turn with the tokenizer's chat template; an error if it has none.
        max_length: the most tokens of prompt + response + EOS, per sequence.
        max_prompt_length: the most prompt tokens (must be below ``max_length``).
        batch_size: pairs per batch.
        num_workers: DataLoader worker processes.
    """

    kind = "preference"

    def __init__(
        self,
        *,
        tokenizer: Any = None,
        train_path: str,
        val_path: str | None = None,
        val_fraction: float = 0.0,
        seed: int = 0,
        format: Literal["fields", "hh_rlhf"] = "fields",
        fields: Fields = Fields(),
        split: str = "train",
        subset: str | None = None,
        max_records: int | None = None,
        skip_invalid: bool = False,
        apply_chat_template: bool = False,
        max_length: int = 512,
        max_prompt_length: int = 256,
        batch_size: int = 8,
        num_workers: int = 0,
    ):
        super().__init__()
        if not 1 <= max_prompt_length < max_length:
            raise ValueError(
                f"need 1 <= max_prompt_length < max_length, got max_prompt_length="
                f"{max_prompt_length}, max_length={max_length}"
            )
        self._init_common(
            tokenizer=tokenizer, train_path=train_path, val_path=val_path,
            val_fraction=val_fraction, seed=seed, format=format, fields=fields, split=split,
            subset=subset, max_records=max_records, skip_invalid=skip_invalid, prompt_words=1,
            apply_chat_template=apply_chat_template, batch_size=batch_size,
            num_workers=num_workers,
        )  # fmt: skip
        self.max_length, self.max_prompt_length = max_length, max_prompt_length
        self.save_hyperparameters(ignore=["tokenizer", "fields"])
        self._fields_hparam()

    def _encode(self, encoder: TextEncoder, examples: list[Example]) -> list[dict[str, Any]]:
        prompts = [e.prompt for e in examples]
        prompt_ids, chosen_ids = encoder.encode_pairs(prompts, [e.chosen or "" for e in examples])
        _, rejected_ids = encoder.encode_pairs(prompts, [e.rejected or "" for e in examples])
        eos = encoder.eos_token_id
        items = []
        for e, p, c, r in zip(examples, prompt_ids, chosen_ids, rejected_ids):
            p = truncate_prompt(p, encoder.prefix, self.max_prompt_length)
            c = truncate_response(p, c, eos, self.max_length)
            r = truncate_response(p, r, eos, self.max_length)
            if c is None or r is None:
                continue
            item: dict[str, Any] = {"chosen_input_ids": p + c, "rejected_input_ids": p + r}
            if e.margin is not None:
                item["margin"] = e.margin
            items.append(item)
        return items

    def train_dataloader(self) -> DataLoader:
        return self._shuffled_train_loader(PreferenceCollator(self.pad_token_id))

    def val_dataloader(self) -> DataLoader | list:
        return self._val_loader(PreferenceCollator(self.pad_token_id))

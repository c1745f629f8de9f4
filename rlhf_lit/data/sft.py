"""Supervised fine-tuning data: (prompt, response) pairs -> right padded batches whose labels
count only the response tokens and the EOS that ends them."""

from __future__ import annotations

from typing import Any, Literal

from torch.utils.data import DataLoader

from rlhf_lit.data.adapters import Example, Fields
from rlhf_lit.data.base import TextDataModule
from rlhf_lit.data.collate import SFTCollator
from rlhf_lit.data.encoding import TextEncoder, encode_sft


class SFTDataModule(TextDataModule):
    """(prompt, response) demonstrations for supervised fine-tuning.

    Batches (right padded): ``input_ids``, ``attention_mask``, ``labels``, each ``(B, T)``;
    ``labels`` is -100 on prompt and padding positions and the token id on response positions,
    including the EOS that ends a response.

    Truncation: the prompt is truncated from the LEFT to ``max_prompt_length`` tokens (keeping
    its end, nearest to the response; BOS-like specials stay in front); the response is truncated
    from the right so that prompt + response + EOS <= ``max_length``. A response that does not fit
    whole with its EOS is cut to fill ``max_length`` and gets no EOS (it did not end). Examples
    whose response keeps no token are dropped, counted and logged once. Details in
    ``rlhf_lit.data.encoding``; formats in ``rlhf_lit.data.adapters``.

    Args:
        tokenizer: Hugging Face tokenizer; set by the CLI from the model stage (must have a pad
            token). Required by ``setup``.
        train_path: training data: a local file (.jsonl, .json, .txt, optionally .gz) if it
            exists, else a Hugging Face hub dataset name (needs ``pip install 'rlhf-lit[hub]'``).
            A path-like string (``./``, ``../``, ``/``, or a data suffix) that does not exist is
            an error, never a hub lookup.
        val_path: validation data from a separate source (same rules as ``train_path``).
        val_fraction: else hold out this fraction of the training examples (seeded by ``seed``);
            0 means no validation. Giving it together with ``val_path`` is an error.
        seed: seed of the validation split and of the training shuffle; None: the run's
            ``seed_everything`` (:mod:`rlhf_lit.run_seed`), so another run seed holds out other
            examples and shuffles them in another order.
        format: record format: ``fields`` (column names from ``fields``), ``hh_rlhf`` (prompt +
            chosen of HH-RLHF transcripts), ``alpaca`` (instruction/input/output, status ok),
            ``paragraphs`` (first ``prompt_words`` words -> rest), ``rankings`` (prompt + the
            first best of the ranked responses).
        fields: column names for the ``fields`` and ``rankings`` formats (and ``text`` for
            ``paragraphs``).
        split: hub split to read.
        subset: hub dataset configuration (subset) name.
        max_records: read at most this many records per source (None: all).
        skip_invalid: skip (and count, log once) lines that do not parse and records with a
            missing, non-string or empty field, instead of raising.
        prompt_words: words in the prompt for the ``paragraphs`` format.
        apply_chat_template: render the prompt as a user turn (with the generation prompt) and
            the response as the assistant turn with the tokenizer's chat template; an error if
            the tokenizer has none.
        max_length: the most tokens of prompt + response + EOS.
        max_prompt_length: the most prompt tokens (must be below ``max_length``).
        batch_size: examples per batch.
        num_workers: DataLoader worker processes.
    """

    kind = "sft"

    def __init__(
        self,
        *,
        tokenizer: Any = None,
        train_path: str,
        val_path: str | None = None,
        val_fraction: float = 0.0,
        seed: int | None = None,
        format: Literal["fields", "hh_rlhf", "alpaca", "paragraphs", "rankings"] = "fields",
        fields: Fields = Fields(),
        split: str = "train",
        subset: str | None = None,
        max_records: int | None = None,
        skip_invalid: bool = False,
        prompt_words: int = 8,
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
            subset=subset, max_records=max_records, skip_invalid=skip_invalid,
            prompt_words=prompt_words, apply_chat_template=apply_chat_template,
            batch_size=batch_size, num_workers=num_workers,
        )  # fmt: skip
        self.max_length, self.max_prompt_length = max_length, max_prompt_length
        self.save_hyperparameters(ignore=["tokenizer", "fields"])
        self._fields_hparam()

    def _encode(self, encoder: TextEncoder, examples: list[Example]) -> list[dict[str, Any]]:
        return encode_sft(
            encoder, [e.prompt for e in examples], [e.response or "" for e in examples],
            max_prompt_length=self.max_prompt_length, max_length=self.max_length, counts=self.truncated,
        )  # fmt: skip

    def train_dataloader(self) -> DataLoader:
        return self._shuffled_train_loader(SFTCollator(self.pad_token_id))

    def val_dataloader(self) -> DataLoader | list:
        return self._val_loader(SFTCollator(self.pad_token_id))


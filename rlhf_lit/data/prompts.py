"""Prompts for PPO rollouts: left padded batches with the dataset row ``index``, drawn by a
resumable sampler so that a resumed run continues with exactly the prompts it had not used."""

from __future__ import annotations

from typing import Any, Literal

from torch.utils.data import DataLoader

from rlhf_lit.data.adapters import Example, Fields
from rlhf_lit.data.base import TextDataModule
from rlhf_lit.data.collate import PromptCollator
from rlhf_lit.data.encoding import TextEncoder, truncate_prompt
from rlhf_lit.data.sampler import ResumableSampler


class PromptDataModule(TextDataModule):
    """Prompts for PPO.

    Batches (left padded, so generation appends on the right): ``input_ids (B, P)``,
    ``attention_mask (B, P)``, ``index (B,)`` (row of the prompt in its dataset). Prompts are
    truncated from the LEFT to ``max_prompt_length`` tokens (BOS-like specials stay in front).

    Exact resume: the training loader draws from a :class:`ResumableSampler` (a permutation per
    epoch seeded with ``seed + epoch``). The consumer (the PPO stage) reports the prompts it has
    used with :meth:`mark_consumed` after each rollout (the DataLoader prefetches, so the sampler
    cannot count this itself); :meth:`state_dict` / :meth:`load_state_dict` (saved into Lightning
    checkpoints) carry the epoch and that count, and a resumed run skips exactly those prompts.

    Args:
        tokenizer: Hugging Face tokenizer; set by the CLI from the model stage (must have a pad
            token). Required by ``setup``.
        train_path: prompts: a local file (.jsonl, .json, .txt, optionally .gz) if it exists,
            else a Hugging Face hub dataset name (needs ``pip install 'rlhf-lit[hub]'``). A
            path-like string that does not exist is an error, never a hub lookup.
        val_path: validation prompts from a separate source (same rules as ``train_path``).
        val_fraction: else hold out this fraction of the prompts (seeded by ``seed``); 0 means
            no validation. Giving it together with ``val_path`` is an error.
        seed: seed of the validation split and of the per-epoch permutation.
        format: record format: ``fields`` (the ``fields.prompt`` column), ``hh_rlhf`` (the
            dialogue up to and including the last ``\\n\\nAssistant:`` of ``chosen``), ``alpaca``
            (the instruction prompt template), ``paragraphs`` (first ``prompt_words`` words).
        fields: column names for the ``fields`` format (and ``text`` for ``paragraphs``).
        split: hub split to read.
        subset: hub dataset configuration (subset) name.
        max_records: read at most this many records per source (None: all).
        skip_invalid: skip (and count, log once) lines that do not parse and records with a
            missing, non-string or empty field, instead of raising.
        prompt_words: words in the prompt for the ``paragraphs`` format.
        apply_chat_template: render each prompt as a user turn with the generation prompt, with
            the tokenizer's chat template; an error if it has none.
        max_prompt_length: the most tokens of a prompt.
        batch_size: prompts per batch (per rollout).
        shuffle: draw the training prompts in a seeded random order per epoch (else in order).
        drop_last: drop the last incomplete training batch of an epoch, so every rollout has
            ``batch_size`` prompts.
        num_workers: DataLoader worker processes.
    """

    kind = "prompt"

    def __init__(
        self,
        *,
        tokenizer: Any = None,
        train_path: str,
        val_path: str | None = None,
        val_fraction: float = 0.0,
        seed: int = 0,
        format: Literal["fields", "hh_rlhf", "alpaca", "paragraphs"] = "fields",
        fields: Fields = Fields(),
        split: str = "train",
        subset: str | None = None,
        max_records: int | None = None,
        skip_invalid: bool = False,
        prompt_words: int = 8,
        apply_chat_template: bool = False,
        max_prompt_length: int = 256,
        batch_size: int = 8,
        shuffle: bool = True,
        drop_last: bool = True,
        num_workers: int = 0,
    ):
        super().__init__()
        if max_prompt_length < 1:
            raise ValueError(f"max_prompt_length must be >= 1, got {max_prompt_length}")
        self._init_common(
            tokenizer=tokenizer, train_path=train_path, val_path=val_path,
            val_fraction=val_fraction, seed=seed, format=format, fields=fields, split=split,
            subset=subset, max_records=max_records, skip_invalid=skip_invalid,
            prompt_words=prompt_words, apply_chat_template=apply_chat_template,
            batch_size=batch_size, num_workers=num_workers,
        )  # fmt: skip
        self.max_prompt_length, self.shuffle, self.drop_last = max_prompt_length, shuffle, drop_last
        self.sampler: ResumableSampler | None = None
        self._pending_state: dict[str, Any] | None = None
        self.save_hyperparameters(ignore=["tokenizer", "fields"])
        self._fields_hparam()

    def _encode(self, encoder: TextEncoder, examples: list[Example]) -> list[dict[str, Any]]:
        ids = encoder.encode_prompts([e.prompt for e in examples])
        return [
            {"input_ids": truncate_prompt(p, encoder.prefix, self.max_prompt_length), "index": i}
            for i, p in enumerate(ids)
        ]

    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        if self.sampler is None:
            assert self.train_dataset is not None
            self.sampler = ResumableSampler(
                len(self.train_dataset), shuffle=self.shuffle, seed=self.seed
            )
            if self._pending_state is not None:
                self.sampler.load_state_dict(self._pending_state)
                self._pending_state = None

    def train_dataloader(self) -> DataLoader:
        dataset = self._require_setup()
        return self._loader(
            dataset, PromptCollator(self.pad_token_id), sampler=self.sampler,
            drop_last=self.drop_last,
        )  # fmt: skip

    def val_dataloader(self) -> DataLoader | list:
        return self._val_loader(PromptCollator(self.pad_token_id))

    # ------------------------------------------------------------------------------ resuming
    def mark_consumed(self, n: int) -> None:
        """Report that training used ``n`` more training prompts (call once per rollout with
        the number of prompts in the batch); this is what a resumed run skips."""
        if self.sampler is None:
            raise RuntimeError("PromptDataModule.setup() has not been called")
        self.sampler.mark_consumed(n)

    def state_dict(self) -> dict[str, Any]:
        if self.sampler is not None:
            return {"sampler": self.sampler.state_dict()}
        return {"sampler": self._pending_state} if self._pending_state is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = state_dict.get("sampler")
        if state is None:
            return
        if self.sampler is not None:
            self.sampler.load_state_dict(state)
        else:
            self._pending_state = dict(state)  # applied in setup, once the data is known

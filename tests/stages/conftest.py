"""Fixtures for the stage tests: tiny models on disk, hand-built batches and a list-backed datamodule.

Batches are built here by hand (not with rlhf_lit.data) so that every position of every mask is
known to the test that uses it.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader


@pytest.fixture(scope="session")
def paragraphs(tinystories) -> list[str]:
    """The first TinyStories validation paragraphs (blank-line separated in the file)."""
    text = Path(tinystories).read_text(encoding="utf-8")
    return [p.strip() for p in text.split("\n\n") if p.strip()][:40]


def encode_pair(tokenizer, prompt: str, response: str) -> tuple[list[int], list[int]]:
    """Prompt ids (with the tokenizer's own special prefix, e.g. BOS) and response ids ending with EOS."""
    prompt_ids = tokenizer(prompt).input_ids
    response_ids = tokenizer(response, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    return prompt_ids, response_ids


def sft_batch(tokenizer, pairs: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    """Right-padded SFT batch per docs/CONTRACTS.md: labels -100 on prompt and pad positions."""
    rows = [encode_pair(tokenizer, p, r) for p, r in pairs]
    T = max(len(p) + len(r) for p, r in rows)
    input_ids = torch.full((len(rows), T), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), T), dtype=torch.long)
    labels = torch.full((len(rows), T), -100, dtype=torch.long)
    for i, (p, r) in enumerate(rows):
        n = len(p) + len(r)
        input_ids[i, :n] = torch.tensor(p + r)
        attention_mask[i, :n] = 1
        labels[i, len(p) : n] = torch.tensor(r)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def pad_rows(rows: list[list[int]], pad_id: int, side: str = "right", length: int | None = None):
    """``(input_ids, attention_mask)`` of ``rows`` padded on ``side`` to ``length`` (default: the longest)."""
    T = length or max(len(r) for r in rows)
    input_ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), T), dtype=torch.long)
    for i, r in enumerate(rows):
        sl = slice(0, len(r)) if side == "right" else slice(T - len(r), T)
        input_ids[i, sl] = torch.tensor(r)
        attention_mask[i, sl] = 1
    return input_ids, attention_mask


def preference_batch(tokenizer, triples: list[tuple[str, str, str]]) -> dict[str, torch.Tensor]:
    """Right-padded preference batch; chosen and rejected padded to one common T (CONTRACTS.md)."""
    chosen, rejected, prompt_length = [], [], []
    for prompt, c, r in triples:
        p, c_ids = encode_pair(tokenizer, prompt, c)
        _, r_ids = encode_pair(tokenizer, prompt, r)
        chosen.append(p + c_ids)
        rejected.append(p + r_ids)
        prompt_length.append(len(p))
    T = max(len(x) for x in chosen + rejected)
    c_ids, c_mask = pad_rows(chosen, tokenizer.pad_token_id, length=T)
    r_ids, r_mask = pad_rows(rejected, tokenizer.pad_token_id, length=T)
    return {
        "chosen_input_ids": c_ids,
        "chosen_attention_mask": c_mask,
        "rejected_input_ids": r_ids,
        "rejected_attention_mask": r_mask,
        "prompt_length": torch.tensor(prompt_length),
    }


class BatchListDataModule(pl.LightningDataModule):
    """Serves pre-built batches (one dict per step) for training and validation."""

    def __init__(self, train: list[dict], val: list[dict] | None = None) -> None:
        super().__init__()
        self.train, self.val = train, val or []

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=None)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=None)


class ReferenceDataModule(BatchListDataModule):
    """Also offers ``reference_dataloader()`` (prompt + response batches) for reward normalisation."""

    def __init__(self, train: list[dict], val: list[dict], reference: list[dict]) -> None:
        super().__init__(train, val)
        self.reference = reference

    def reference_dataloader(self) -> DataLoader:
        return DataLoader(self.reference, batch_size=None)


def cpu_trainer(tmp_path, max_steps: int, logger=False, **kwargs) -> pl.Trainer:
    """A quiet single-process CPU trainer writing only under ``tmp_path``."""
    defaults = dict(
        accelerator="cpu",
        devices=1,
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        max_steps=max_steps,
        default_root_dir=str(tmp_path),
        num_sanity_val_steps=0,
        log_every_n_steps=1,
    )
    defaults.update(kwargs)
    return pl.Trainer(**defaults)


@pytest.fixture(scope="session")
def helpers() -> SimpleNamespace:
    """The builders above, as a fixture (test modules do not import conftest)."""
    return SimpleNamespace(
        encode_pair=encode_pair,
        sft_batch=sft_batch,
        pad_rows=pad_rows,
        preference_batch=preference_batch,
        BatchListDataModule=BatchListDataModule,
        ReferenceDataModule=ReferenceDataModule,
        cpu_trainer=cpu_trainer,
    )

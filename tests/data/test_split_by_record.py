"""A ``val_fraction`` split draws records by their position in the source, the records a format skips counted, so
every data module reading one file with one ``val_fraction`` and ``seed`` holds out the same records."""

from __future__ import annotations

import pytest
import torch
from data_assets import write_jsonl

from rlhf_lit.data import PreferenceDataModule, PromptDataModule, SFTDataModule
from rlhf_lit.data.prompt_source import hh_reading
from rlhf_lit.data.splits import split_by_fraction

N, FRACTION, SEED = 20, 0.25, 7
HELD = torch.randperm(N, generator=torch.Generator().manual_seed(SEED))[: round(FRACTION * N)].tolist()
"""The positions the rule holds out, by hand: a permutation of the N positions seeded with SEED, its first
round(0.25 * 20) = 5."""


def _hh_records(skipped: int) -> list[dict]:
    """N HH transcripts; the pair reader skips record ``skipped`` (its rejected answers another question), the
    prompt and SFT readers read every record (they read the chosen transcript only)."""
    records = []
    for k in range(N):
        other = "another question" if k == skipped else f"question {k}"
        records.append(
            {
                "chosen": f"\n\nHuman: question {k}\n\nAssistant: yes {k}",
                "rejected": f"\n\nHuman: {other}\n\nAssistant: no {k}",
            }
        )
    return records


def _held_out_lines(path: str) -> set[str]:
    """The records of :data:`HELD` (a record at position k is its file's line k + 1)."""
    return {f"{path} line {k + 1}" for k in HELD}


def _val_lines(module, tokenizer) -> set[str]:
    """The records (``where``) of the examples the set-up module validates on, read as its setup read them."""
    _, val, _ = module.read_splits(hh_reading(module.hh_render, tokenizer, "hh_render"))
    return {e.where for e in val}


def _modules(path: str, tokenizer) -> dict[str, object]:
    common = dict(tokenizer=tokenizer, train_path=path, format="hh_rlhf", hh_render="never")
    common.update(val_fraction=FRACTION, seed=SEED, batch_size=2)
    return {
        "preference": PreferenceDataModule(**common, max_length=48, max_prompt_length=24),
        "prompt": PromptDataModule(**common, max_prompt_length=24),
        "sft": SFTDataModule(**common, max_length=48, max_prompt_length=24),
    }


def test_the_held_out_records_are_drawn_by_position_whatever_a_format_skips(tmp_path, stories_tok):
    skipped = min(HELD)  # a held-out record the pair reader skips: the records after it shift by one
    assert skipped < max(HELD)
    path = write_jsonl(tmp_path / "hh.jsonl", _hh_records(skipped))
    expected = _held_out_lines(path)
    lines = {}
    for kind, module in _modules(path, stories_tok).items():
        module.setup("fit")
        lines[kind] = _val_lines(module, stories_tok)
        assert module.stats["val_examples"] == len(lines[kind])  # setup validates on those examples
    assert lines["prompt"] == lines["sft"] == expected
    assert lines["preference"] == expected - {f"{path} line {skipped + 1}"}  # the pair the format skips


def test_a_skipped_training_record_moves_no_held_out_one(tmp_path, stories_tok):
    skipped = next(k for k in range(N) if k not in HELD)  # the first training record: every later one shifts
    path = write_jsonl(tmp_path / "hh.jsonl", _hh_records(skipped))
    lines = {kind: _val_lines(module, stories_tok) for kind, module in _modules(path, stories_tok).items()}
    assert lines["preference"] == lines["prompt"] == lines["sft"] == _held_out_lines(path)


def test_split_by_fraction_by_positions_keeps_order_and_counts_the_records_left_out():
    # 10 records, positions 3 and 8 left out by a format: 8 items. Held out: the first round(0.3 * 10) = 3 of a
    # permutation of range(10) seeded with 0.
    positions = [0, 1, 2, 4, 5, 6, 7, 9]
    items = [f"r{p}" for p in positions]
    held = set(torch.randperm(10, generator=torch.Generator().manual_seed(0))[:3].tolist())
    train, val = split_by_fraction(items, 0.3, 0, positions=positions, records=10)
    assert val == [f"r{p}" for p in positions if p in held]
    assert train == [f"r{p}" for p in positions if p not in held]


def test_a_split_whose_held_out_records_were_all_skipped_says_so():
    held = torch.randperm(10, generator=torch.Generator().manual_seed(0))[:1].tolist()  # round(0.1 * 10) = 1
    positions = [p for p in range(10) if p not in held]
    with pytest.raises(ValueError, match=r"holds out 1 of 10 records, which give 0 validation and 9 training"):
        split_by_fraction(positions, 0.1, 0, positions=positions, records=10)

"""A stand-in for the ``datasets`` library, so that the hub branch of the data readers runs offline."""

from __future__ import annotations

import sys
import types


def fake_hub(monkeypatch, splits: dict[str, list[dict]]) -> list:
    """``datasets`` as a stand-in holding ``splits``: ``load_dataset`` records its calls and refuses another split
    with the words of datasets 5 (checked against the real library in test_prompt_source.py)."""
    calls = []

    def load_dataset(name, subset=None, split=None):
        calls.append((name, subset, split))
        if split not in splits:
            raise ValueError(f'Unknown split "{split}". Should be one of {list(splits)}.')
        return splits[split]

    fake = types.ModuleType("datasets")
    fake.load_dataset = load_dataset
    fake.get_dataset_split_names = lambda name, subset=None: list(splits)
    monkeypatch.setitem(sys.modules, "datasets", fake)
    return calls

"""Paths of the shipped data assets (assets/, see assets/README.md), a small file-writing helper and chat messages for the data tests."""

import json
from pathlib import Path

from assets_paths import ALPACA_V1, ALPACA_V2, ASSETS, DATA, GPT2_TOKENIZER, STORIES260K, TINYSTORIES  # noqa: F401
from assets_paths import HH_RLHF as HH  # noqa: F401


def write_jsonl(path: Path, records) -> str:
    """Write records (dicts, or raw strings written as they are) one per line; returns the path."""
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return str(path)


def system(text: str) -> dict[str, str]:
    """A system message."""
    return {"role": "system", "content": text}


def user(text: str) -> dict[str, str]:
    """A user message."""
    return {"role": "user", "content": text}


def bot(text: str) -> dict[str, str]:
    """An assistant message."""
    return {"role": "assistant", "content": text}

"""Paths of the shipped data assets (assets/, see assets/README.md) and a small file-writing helper for the data tests."""

import json
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
ASSETS = _ROOT / "assets"
DATA = ASSETS / "data"
HH = DATA / "hh-rlhf" / "harmless-base-test.jsonl.gz"
ALPACA_V1 = DATA / "alpaca-libre" / "alpaca_libre_tasks_v1.jsonl"
ALPACA_V2 = DATA / "alpaca-libre" / "alpaca_libre_tasks_v2.jsonl"
TINYSTORIES = DATA / "tinystories" / "val.txt"
STORIES260K = ASSETS / "models" / "stories260K"


def write_jsonl(path: Path, records) -> str:
    """Write records (dicts, or raw strings written as they are) one per line; returns the path."""
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return str(path)

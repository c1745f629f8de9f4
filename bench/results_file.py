"""Where a bench writes its result: ``bench/results/<name>-<UTC date>.json``, or ``-2``, ``-3``, ... when a
run of that day is already there (a result is a record of a run, never written over)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def utc_date() -> str:
    """Today's UTC date, ``YYYY-MM-DD``: the date a result records."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")


def new_result_path(name: str, date: str | None = None) -> Path:
    """A result file of ``name`` for ``date`` (default today) that does not exist yet."""
    stem = f"{name}-{(date or utc_date()).replace('-', '')}"
    path, n = RESULTS / f"{stem}.json", 1
    while path.exists():
        n += 1
        path = RESULTS / f"{stem}-{n}.json"
    return path

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


def write_result(name: str, fields: dict) -> Path:
    """Write ``fields`` as a new result of ``name`` (:func:`new_result_path`), after the date, the machine and
    the command that every result records; prints and returns its path."""
    import json
    import os
    import platform
    import shlex
    import sys

    date = utc_date()
    path = new_result_path(name, date)
    result = {
        "date": date,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}",
        "command": shlex.join([sys.executable, *sys.argv]),
        **fields,
    }
    path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"written to {path}")
    return path

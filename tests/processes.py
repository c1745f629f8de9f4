"""This machine's running processes as the tests that stop a run see them: a stopped run must leave no
process behind that still names its folder (a stage, a fit, a labeller)."""

from __future__ import annotations

from pathlib import Path


def pids_naming(text: str) -> list[int]:
    """Pids of this machine's processes whose command line holds ``text`` (a process that ends while it is
    read is skipped)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace"
            ):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids

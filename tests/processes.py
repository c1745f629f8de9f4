"""This machine's running processes as the tests that stop a run see them: a stopped run must leave no
process behind that still names its folder (a stage, a fit, a labeller)."""

from __future__ import annotations

import os
import subprocess
import time
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


def signal_in_popen(monkeypatch, signum: int) -> None:
    """Send ``signum`` to this process from inside :class:`subprocess.Popen`'s constructor, right after it has
    created the child: where a signal lands while Popen waits for the child's exec."""
    close_pipe_fds = subprocess.Popen._close_pipe_fds

    def signalled(self, *fds):
        close_pipe_fds(self, *fds)
        os.kill(os.getpid(), signum)
        for _ in range(100):  # the handler runs in this (the main) thread between two bytecodes
            time.sleep(0.001)

    monkeypatch.setattr(subprocess.Popen, "_close_pipe_fds", signalled)

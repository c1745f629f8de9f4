"""Running the demo's stages as subprocesses: started in parallel, timed, stopped on a failure.

Every training stage and the preference command run as the commands a user would type, one
thread each (:data:`THREAD_ENV`), their output in ``<out>/logs/<stage>.log``; a failing stage
stops the others and raises :class:`StageFailed` with the tail of its log.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from demo.plan import ROOT

if TYPE_CHECKING:  # annotations only
    from demo.plan import Paths

THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
"""One thread per process: on tiny models two threads under load were measured 10-50x slower."""


class StageFailed(RuntimeError):
    """A stage's subprocess exited non-zero; ``returncode`` is its exit status."""

    def __init__(self, stage: str, returncode: int, log_path: Path) -> None:
        tail = _tail(log_path, 40)
        super().__init__(f"stage {stage!r} failed with exit status {returncode}; log: {log_path}\n{tail}")
        self.returncode = returncode


def _tail(path: Path, lines: int) -> str:
    try:
        return "".join(path.read_text(encoding="utf-8", errors="replace").splitlines(True)[-lines:])
    except OSError:
        return ""


def child_env() -> dict[str, str]:
    """The environment of every subprocess: this one's, :data:`THREAD_ENV`, and the checkout first on
    ``PYTHONPATH`` (a ``python -m demo ...`` child finds the demo from whatever folder it starts in)."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, **THREAD_ENV, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else "")}


def say(message: str) -> None:
    """Print ``[demo] <message>`` at once (the pipeline's progress lines)."""
    print(f"[demo] {message}", flush=True)


def _start(stage: str, cmd: list[str], paths: Paths) -> tuple[subprocess.Popen, Path]:
    """Start ``cmd`` with one thread, its output going to ``<out>/logs/<stage>.log``."""
    log_path = paths.dir("logs") / f"{stage.replace('/', '_')}.log"  # dpo/beta_0.1 -> dpo_beta_0.1.log
    say(f"{stage}: {shlex.join(cmd)}")
    with open(log_path, "w", encoding="utf-8") as f:  # the child keeps its own handle
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=child_env())
    return proc, log_path


Running = dict[str, tuple[subprocess.Popen, Path, float]]
"""Started stages: name -> (process, log path, start time)."""


def start_stages(stages: dict[str, list[str]], paths: Paths) -> Running:
    """Start the commands of ``stages`` in parallel (one process each) without waiting."""
    return {name: (*_start(name, cmd, paths), time.perf_counter()) for name, cmd in stages.items()}


def stop_stages(running: Running) -> None:
    """Stop the stages of ``running`` still alive (their results would be discarded) and reap them."""
    for proc, _, _ in running.values():
        if proc.poll() is None:
            proc.terminate()
    for proc, _, _ in running.values():
        proc.wait()


class Timings(dict):
    """Wall seconds per stage (the dict, in the order stages finish) and, in :attr:`cpu`, the CPU
    seconds (user + system) of each subprocess stage: on a machine shared with other jobs the wall
    time depends on their load, the CPU time much less."""

    def __init__(self) -> None:
        super().__init__()
        self.cpu: dict[str, float] = {}


POLL_S = 0.2
"""How often :func:`wait_stages` looks for finished stages (a stage's wall time is this exact)."""


def wait_stages(running: Running, timings: Timings, background: Running | None = None) -> None:
    """Wait for every stage of ``running``; raise :class:`StageFailed` at the first failure.

    Records each stage's wall time (from its own start to its exit, whichever order they finish
    in) and its CPU time in ``timings``. Stages of ``background`` that end meanwhile are timed and
    checked the same way and removed from it; the others keep running. When a stage fails, every
    other one is stopped.
    """
    pending = dict(running)
    background = {} if background is None else background
    while pending:
        for group in (pending, background):
            for name, (proc, log_path, t0) in list(group.items()):
                # wait4 instead of poll: the child's own resource usage comes with its exit status.
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid == 0:
                    continue
                proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: tell Popen
                del group[name]
                timings[name] = time.perf_counter() - t0
                timings.cpu[name] = usage.ru_utime + usage.ru_stime
                if proc.returncode != 0:
                    stop_stages(running)
                    stop_stages(background)
                    raise StageFailed(name, proc.returncode, log_path)
                say(f"{name}: done in {timings[name]:.1f} s ({timings.cpu[name]:.1f} s CPU)")
        if pending:
            time.sleep(POLL_S)


def run_stages(stages: dict[str, list[str]], paths: Paths, timings: Timings) -> None:
    """Run the commands of ``stages`` in parallel and wait for all; raise :class:`StageFailed` on any failure."""
    wait_stages(start_stages(stages, paths), timings)

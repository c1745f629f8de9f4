"""Commands run in child processes: the one runner of ``rlhf-lit iterate``'s and ``rlhf-lit seeds``' fits and of
the offline demo's runs.

- :func:`start`: a child whose log opens with its command line (:func:`header`), then its output (stdout and
  stderr), stdin closed, in a session of its own (a terminal's Ctrl-C reaches the parent alone);
- :func:`run`: start and wait; its exit status (:func:`run_logged`: timed, :class:`RunFailed` unless 0). Whatever
  ends the wait first (an exception; SIGTERM or SIGINT raised by :func:`stop_on_signals`) stops the child too
  (:func:`stop`): it gets SIGTERM (:func:`signal_for`), :data:`GRACE_S` seconds to end (a fit ends
  its step or rollout and writes ``last.ckpt``), then SIGKILL. No child outlives the wait to hold its run
  directory's lock.
- :func:`run_pool`: a function over jobs, N at a time in threads that each wait on their children. After a failure
  no further job starts, and the first failure (in job order) is raised once the running jobs end. A stop of the
  waiting thread stops every child the jobs wait on, as :func:`run` does, and waits for them.
- :class:`RunFailed`: one line naming what failed, its exit status, its log's last error (:func:`last_error`) and
  the log; :meth:`RunFailed.tail` the log's last lines.

Standard library only: the commands and the demo (which may not import them) share it.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import IO, TypeVar

GRACE_S = 60.0
"""Seconds a stopped child has to end before it is killed: a fit ends its step or rollout and writes ``last.ckpt``."""
HEADER = "$ "
"""How a run's first log line starts (its command line follows)."""
ERROR_PREFIX = "rlhf-lit: error: "


def rlhf_lit_command(args: Sequence[str]) -> list[str]:
    """``rlhf-lit <args>`` with this interpreter (``python -m rlhf_lit.cli``), whatever ``rlhf-lit`` is on PATH."""
    return [sys.executable, "-m", "rlhf_lit.cli", *args]


def header(cmd: Sequence[str]) -> str:
    """A run's first log line: ``$ <command>``, shell-quoted, ``rlhf-lit ...`` for :func:`rlhf_lit_command`'s."""
    program = rlhf_lit_command([])
    shown = ["rlhf-lit", *cmd[len(program) :]] if list(cmd[: len(program)]) == program else list(cmd)
    return f"{HEADER}{shlex.join(shown)}\n"


def log_lines(log_path: str | os.PathLike) -> list[str] | None:
    """The log's lines, each with its line break; None when it cannot be read."""
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            return f.read().splitlines(True)
    except OSError:
        return None


def last_error(log_path: str | os.PathLike) -> str:
    """The last ``rlhf-lit: error:`` line of the log's last run (after its last header), else its last non-empty
    line; ``no output`` when it printed nothing, ``no log`` when the log cannot be read."""
    lines = log_lines(log_path)
    if lines is None:
        return "no log"
    since = max((i + 1 for i, line in enumerate(lines) if line.startswith(HEADER)), default=0)
    lines = [line.strip() for line in lines[since:] if line.strip()]
    errors = [line for line in lines if line.startswith(ERROR_PREFIX)]
    return (errors or lines or ["no output"])[-1].removeprefix(ERROR_PREFIX)


class RunFailed(RuntimeError):
    """A child exited with a non-zero status: ``<what> failed (exit status N): <its last error>; its log: <log>``."""

    def __init__(self, what: str, returncode: int, log_path: str | os.PathLike) -> None:
        super().__init__(f"{what} failed (exit status {returncode}): {last_error(log_path)}; its log: {log_path}")
        self.returncode, self.log_path = returncode, log_path

    def tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the failed run's log (``""`` when it cannot be read)."""
        return "".join((log_lines(self.log_path) or [])[-lines:])


class Stopped(SystemExit):
    """SIGTERM or SIGINT received under :func:`stop_on_signals`: exit status ``128 + signum`` (143, 130)."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


def signal_for(error: BaseException) -> int:
    """The signal children get when ``error`` stops their wait, whatever it is (SIGTERM, SIGINT, Ctrl-C, any
    exception): SIGTERM, on which an rlhf-lit fit finishes its step and writes ``last.ckpt``
    (:class:`~rlhf_lit.callbacks.preemption.Preemption`); on SIGINT it would stop without one."""
    return signal.SIGTERM


class _Held:
    """How deep the main thread is in :func:`signals_held` blocks, and the signal received meanwhile."""

    depth: int = 0
    signum: int | None = None


HELD = _Held()


@contextmanager
def signals_held() -> Iterator[None]:
    """Inside (in the main thread), a signal of :func:`stop_on_signals` raises :class:`Stopped` only on leaving,
    once what was started inside is where the caller's stop finds it: raised while :class:`subprocess.Popen`
    waits for the new child's exec, it would leave a running child that Popen never returns. A block left
    by an exception of its own drops the held signal (that exception stops the same children)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    HELD.depth += 1
    try:
        yield
    finally:
        HELD.depth -= 1
        held, HELD.signum = (HELD.signum, None) if HELD.depth == 0 else (None, HELD.signum)
    if held is not None:
        raise Stopped(held)


@contextmanager
def stop_on_signals(command: str, then: str = "run the same command again to continue") -> Iterator[None]:
    """While inside, SIGTERM and SIGINT raise :class:`Stopped` in the main thread (elsewhere nothing changes), once,
    after one line ``rlhf-lit: <command> stopped by <SIGNAL> (its running fits too); <then>``: a second signal
    while the running children are being stopped is ignored (an exception there would leave them running)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def stopped(signum: int, frame: object) -> None:
        if received:
            return
        received.append(signum)
        name = signal.Signals(signum).name
        sys.stderr.write(f"rlhf-lit: {command} stopped by {name} (its running fits too); {then}\n")
        if HELD.depth:
            HELD.signum = signum  # raised when the signals_held block ends
            return
        raise Stopped(signum)

    before = {signum: signal.signal(signum, stopped) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)


def start(cmd: Sequence[str], log: IO[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """``cmd`` in a child process, its :func:`header` then its output written to ``log`` (an open text file)."""
    log.write(header(cmd))
    log.flush()
    # A session of its own: a terminal's Ctrl-C reaches the parent alone, which stops the child with SIGTERM.
    return subprocess.Popen(
        list(cmd), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
    )


def _send(child: subprocess.Popen, signum: int) -> None:
    """``signum`` to the child unless it has ended (and been reaped meanwhile)."""
    try:
        child.send_signal(signum)
    except ProcessLookupError:
        pass


def stop(*children: subprocess.Popen, signum: int = signal.SIGTERM, grace_s: float | None = None) -> None:
    """Send ``signum`` to each child, give them ``grace_s`` seconds together (:data:`GRACE_S` by default) to end,
    kill the rest; all reaped. Only for children this thread waits on (:func:`run_pool` stops those of others)."""
    for child in children:
        _send(child, signum)
    deadline = time.monotonic() + (GRACE_S if grace_s is None else grace_s)
    for child in children:
        try:
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _send(child, signal.SIGKILL)
            child.wait()


class _Waited:
    """The children :func:`run` waits on, in any thread, and the signal :func:`run_pool` is stopping them with."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.children: set[subprocess.Popen] = set()
        self.stopping: int | None = None


WAITED = _Waited()


def run(cmd: Sequence[str], log: str | os.PathLike | IO[str], env: dict[str, str] | None = None) -> int:
    """Run ``cmd`` in a child process, its output appended to ``log`` (a path, or an open text file); its exit
    status. Whatever ends the wait stops the child (:func:`stop`, with :func:`signal_for` the error)."""
    with WAITED.changed:
        if WAITED.stopping is not None:  # the pool is stopping: no new child
            raise Stopped(WAITED.stopping)
    if not hasattr(log, "write"):
        os.makedirs(os.path.dirname(os.fspath(log)) or ".", exist_ok=True)
        with open(log, "a", encoding="utf-8") as f:  # the child keeps its own handle
            return run(cmd, f, env)
    child: subprocess.Popen | None = None
    try:
        with signals_held():  # a signal while the child starts is raised once it is `child`
            child = start(cmd, log, env)  # type: ignore[arg-type]
            with WAITED.changed:
                WAITED.children.add(child)
                late = WAITED.stopping  # the pool began to stop while this child started: it missed the signal
        if late is not None:
            raise Stopped(late)
        return child.wait()
    except BaseException as error:
        if child is not None:
            stop(child, signum=signal_for(error))
        raise
    finally:
        if child is not None:
            with WAITED.changed:
                WAITED.children.discard(child)
                WAITED.changed.notify_all()


def run_rlhf_lit(args: Sequence[str], log_path: str) -> int:
    """``rlhf-lit <args>`` by :func:`run`, its output appended to ``log_path``; its exit status."""
    return run(rlhf_lit_command(args), log_path)


def run_logged(
    cmd: Sequence[str], log: str | os.PathLike | IO[str], what: str, env: dict[str, str] | None = None
) -> float:
    """:func:`run`; its wall seconds, or :class:`RunFailed` (naming ``what``) for a non-zero exit status."""
    t0 = time.perf_counter()
    status = run(cmd, log, env)
    if status != 0:
        raise RunFailed(what, status, log.name if hasattr(log, "write") else log)  # type: ignore[union-attr]
    return time.perf_counter() - t0


def _stop_waited(signum: int) -> None:
    """Stop every child :func:`run` waits on in other threads: ``signum``, :data:`GRACE_S` seconds, SIGKILL;
    returns once their waits have ended. New runs are refused until :func:`run_pool` ends."""
    with WAITED.changed:
        WAITED.stopping = signum
        children = list(WAITED.children)
    for child in children:
        _send(child, signum)
    with WAITED.changed:
        if not WAITED.changed.wait_for(lambda: not WAITED.children, timeout=GRACE_S):
            for child in WAITED.children:
                _send(child, signal.SIGKILL)
            WAITED.changed.wait_for(lambda: not WAITED.children)


Job = TypeVar("Job")
Result = TypeVar("Result")


class _NotStarted(Exception):
    """A job :func:`run_pool` did not start because another one had failed."""


def run_pool(fn: Callable[[Job], Result], jobs: Iterable[Job], workers: int) -> list[Result]:
    """``fn`` of every job, ``workers`` at a time in threads; the results in job order.

    After a failure no further job starts; the first failure in job order is raised once the running jobs end
    (with ``workers=1`` a plain loop that stops at the failing job). A stop of this thread's wait (SIGTERM or
    SIGINT under :func:`stop_on_signals`, Ctrl-C, any exception) stops the children the jobs wait on with
    :func:`signal_for` it and waits for them, then is raised.
    """
    failed = threading.Event()

    def guarded(job: Job) -> Result:
        if failed.is_set():
            raise _NotStarted
        try:
            return fn(job)
        except BaseException:
            failed.set()
            raise

    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(guarded, job) for job in jobs]
            try:
                wait(futures)
            except BaseException as error:
                failed.set()
                _stop_waited(signal_for(error))
                raise
    finally:
        with WAITED.changed:
            WAITED.stopping = None
    # A job is skipped only after an earlier-started one failed: in order, a real failure comes first.
    return [future.result() for future in futures]

"""``rlhf-lit`` as a process of its own, forked from the test's process instead of started anew.

A new process imports torch, Lightning and transformers again before it reads its first argument:
about 7 s of CPU on the development machines, more than most of the short runs the suite starts. A
fork of the test's process (which has imported them) costs nothing of that and is still a real
process: its own pid and process group (or session), its own exit status, signals sent from
outside, and a launcher that starts more processes: under ``ddp`` / ``fsdp2`` Lightning's launcher
starts rank 1 from the fork as it does from the console script (``python <console script> <args>``,
a new interpreter), so what is tested across ranks is untouched.

The fork is made to look like a process just started by the console script (``from rlhf_lit.cli
import main; sys.exit(main())``): ``sys.argv``, ``__main__`` (no spec, so Lightning's launcher
re-runs the script), the environment of :func:`suite_env.subprocess_env`, the working directory,
standard streams on the given files (stdin on ``/dev/null``), logging handlers on those streams,
Python's default signal handlers (but for :mod:`faulthandler`'s on the fatal signals, which print a
crash's stack into the fork's stderr) and warnings filters, no exit handlers of the test's process (its
temporary folders are its own), and the global switches :func:`cli_in_process.isolated_main_state`
names. What a fork cannot reset is what a library read from the environment when it was imported
(the Hugging Face offline flags, endpoint and cache): :func:`start` refuses an ``env`` that sets one,
and a test that needs one starts the console script (``cli_helpers.rlhf_lit``). Tests whose point
is the terminal output of a fresh interpreter (warnings printed once, progress bars) start it too.
"""

from __future__ import annotations

import atexit
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path

from fresh_process import fresh_logging, fresh_process, streams_on_fds
from suite_env import REMOVED, subprocess_env

CLI = Path(sys.executable).parent / "rlhf-lit"
_REAL_POPEN = subprocess.Popen
READ_AT_IMPORT = tuple(name for name in REMOVED if name.startswith(("HF_", "TRANSFORMERS_", "HUGGING")))
"""Variables the Hugging Face libraries read once, at import: a fork keeps the test process's values."""


class ForkedProcess:
    """A forked ``rlhf-lit`` process, with the part of :class:`subprocess.Popen` the tests use."""

    def __init__(self, pid: int, args: list[str]):
        self.pid, self.args, self.returncode = pid, args, None

    def poll(self) -> int | None:
        """The exit status once the process has ended (negative: killed by that signal), else None."""
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit status; :class:`subprocess.TimeoutExpired` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` to the process (nothing once it has been reaped)."""
        if self.returncode is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        """SIGKILL."""
        self.send_signal(signal.SIGKILL)


def _run_module(module: str) -> object:
    """``python -m <module>``: its code run anew as ``__main__`` (not the test process's imported copy)."""
    sys.modules.pop(module, None)
    return runpy.run_module(module, run_name="__main__", alter_sys=True)


def _exit_status(entry: Callable[[], object]) -> int:
    """What the interpreter's exit status would be after running ``entry``."""
    try:
        returned = entry()
        return returned if isinstance(returned, int) else 0
    except SystemExit as done:  # what the interpreter makes of sys.exit(...)
        if done.code is None or isinstance(done.code, int):
            return done.code or 0
        print(done.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001  (an uncaught exception: traceback, status 1)
        traceback.print_exc()
        return 1


def _fork(
    entry: Callable[[], object],
    argv: list[str],
    cwd: Path,
    environ: dict[str, str],
    stdout: int,
    stderr: int,
    new_session: bool,
    fork_children: bool,
    fork_ranks: bool = True,
) -> ForkedProcess:
    """Fork; the child becomes a fresh process (:func:`fresh_process.fresh_process`) running ``entry`` and exits."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return ForkedProcess(pid, argv)
    status = 1
    try:
        if new_session:
            os.setsid()
        old = (sys.stdout, sys.__stdout__, sys.stderr, sys.__stderr__)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        streams_on_fds(old)
        fresh_logging()
        fresh_process(argv, cwd, environ)
        _FORKED_HERE.update(modules=fork_children, ranks=fork_ranks)
        if fork_children or fork_ranks:
            subprocess.Popen = ForkingPopen  # (subprocess.run and Lightning's launcher included)
        status = _exit_status(entry)
        atexit._run_exitfuncs()  # the handlers this run registered
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001
        try:
            traceback.print_exc()
        finally:
            os._exit(1)
    os._exit(status)


def _refuse_read_at_import(env: dict[str, str] | None) -> None:
    read_at_import = sorted(set(env or {}) & set(READ_AT_IMPORT))
    if read_at_import:
        raise ValueError(f"{read_at_import} are read at import: start the console script (cli_helpers.rlhf_lit)")


def _console_script() -> object:
    from rlhf_lit.cli import main

    return main()


def _output_fds(stdout: Path, stderr: Path | None) -> tuple[int, int]:
    out_fd = os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    err_fd = out_fd if stderr is None else os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    return out_fd, err_fd


def _close(*fds: int) -> None:
    for fd in set(fds):
        os.close(fd)


def start(
    args: list[str],
    *,
    cwd: Path,
    stdout: Path,
    stderr: Path | None = None,
    env: dict[str, str] | None = None,
    new_session: bool = False,
    fork_children: bool = False,
    fork_ranks: bool = True,
) -> ForkedProcess:
    """``rlhf-lit <args>`` in a forked process, its stdout (and stderr, or into ``stdout``) written to
    files; ``new_session``: its own session and process group (``os.killpg(proc.pid, ...)``);
    ``fork_children``: the ``python -m`` processes it starts (``rlhf-lit seeds`` / ``iterate``'s fits)
    forked from it too (:class:`ForkingPopen`); ``fork_ranks``: the ranks Lightning's launcher starts
    (``devices: 2``: rank 1 runs the console script again) forked from it, made fresh as rank 0 is
    (False: a new interpreter, as a user's rank 1 is; torchrun's ranks are new interpreters always)."""
    _refuse_read_at_import(env)
    out_fd, err_fd = _output_fds(stdout, stderr)
    try:
        return _fork(
            _console_script,
            [str(CLI), *args],
            Path(cwd),
            subprocess_env(env),
            out_fd,
            err_fd,
            new_session,
            fork_children,
            fork_ranks,
        )
    finally:
        _close(out_fd, err_fd)


def start_module(
    module: str,
    args: list[str],
    *,
    cwd: Path,
    stdout: Path,
    stderr: Path | None = None,
    env: dict[str, str] | None = None,
) -> ForkedProcess:
    """``python -m <module> <args>`` in a forked process (output as :func:`start`); the processes it
    starts as ``python -m <module> ...`` (the demo's stages: ``rlhf_lit.cli``, ``demo ...``) are forked
    from it in turn (:class:`ForkingPopen`)."""
    _refuse_read_at_import(env)
    out_fd, err_fd = _output_fds(stdout, stderr)
    try:
        return _fork(
            partial(_run_module, module),
            [module, *args],
            Path(cwd),
            subprocess_env(env),
            out_fd,
            err_fd,
            False,
            fork_children=True,
        )
    finally:
        _close(out_fd, err_fd)


def _completed(proc: ForkedProcess, out: Path, err: Path, timeout: int) -> subprocess.CompletedProcess:
    try:
        status = proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
    _report_crash(status, stderr)
    return subprocess.CompletedProcess(proc.args, status, stdout, stderr)


def _report_crash(status: int, stderr: str) -> None:
    """A failed run with a crash report (:func:`faulthandler`'s) in its output, from the process itself or
    from a process it forked (a rank, a stage: they share its stderr): the report on the test's own
    stderr, which pytest shows with a failure (a test's message often quotes the end of the output,
    where another rank's error about the lost connection comes after the crash)."""
    start = stderr.find("Fatal Python error")
    if status != 0 and start >= 0:
        print(
            f"[cli_forked] the run ended with status {status}, and a process of it crashed:\n"
            f"{stderr[start : start + 6000]}",
            file=sys.stderr,
        )


def run(
    *args: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: int = 600,
    fork_children: bool = False,
    fork_ranks: bool = True,
) -> subprocess.CompletedProcess:
    """``rlhf-lit <args>`` in a forked process (:func:`start`) until it ends: what
    ``cli_helpers.rlhf_lit`` returns (the exit status, stdout, stderr)."""
    with tempfile.TemporaryDirectory(prefix="rlhf-lit-fork-") as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        proc = start(
            list(args), cwd=cwd, stdout=out, stderr=err, env=env, fork_children=fork_children, fork_ranks=fork_ranks
        )
        return _completed(proc, out, err, timeout)


def run_module(module: str, *args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -m <module> <args>`` in a forked process (:func:`start_module`) until it ends."""
    with tempfile.TemporaryDirectory(prefix="rlhf-lit-fork-") as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        return _completed(start_module(module, list(args), cwd=cwd, stdout=out, stderr=err), out, err, timeout)


def _run_script(path: str) -> object:
    """``python <path>``: the script run as ``__main__`` with its folder first on ``sys.path``."""
    sys.path.insert(0, str(Path(path).parent))
    return runpy.run_path(path, run_name="__main__")


def run_script(
    path: Path, *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: int = 600
) -> subprocess.CompletedProcess:
    """``python <path> <args>`` in a forked process until it ends (output as :func:`run`)."""
    _refuse_read_at_import(env)
    with tempfile.TemporaryDirectory(prefix="rlhf-lit-fork-") as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        out_fd, err_fd = _output_fds(out, err)
        try:
            proc = _fork(
                partial(_run_script, str(path)),
                [str(path), *args],
                Path(cwd),
                subprocess_env(env),
                out_fd,
                err_fd,
                False,
                fork_children=False,
            )
        finally:
            _close(out_fd, err_fd)
        return _completed(proc, out, err, timeout)


_FORKED_HERE = {"modules": False, "ranks": False}
"""What a forked process forks in turn: ``python -m`` commands, the console script run again (a rank)."""


class ForkingPopen(subprocess.Popen):
    """:class:`subprocess.Popen` inside a forked process: a ``[sys.executable, "-m", module, ...]``
    command (when ``fork_children``) or this process's own console script run again (Lightning's
    launcher starting a rank, when ``fork_ranks``) whose output goes to files (or is inherited) is
    forked from this process (a fresh one, as :func:`start` makes it, with the command's
    environment); anything else (pipes, another program, a changed variable the libraries read at
    import) is started as usual."""

    def __new__(cls, cmd, *args, **kwargs):  # noqa: D102
        if _forkable(cmd, args, kwargs):
            return _ForkedChild(cmd, **kwargs)
        return _REAL_POPEN(cmd, *args, **kwargs)


def _is_rank_launch(cmd) -> bool:
    """``[sys.executable, <this process's console script>, ...]``: Lightning's launcher starting a rank."""
    return len(cmd) >= 2 and cmd[0] == sys.executable and cmd[1] == str(CLI) == os.path.abspath(sys.argv[0])


def _forkable(cmd, args: tuple, kwargs: dict) -> bool:
    if args or not isinstance(cmd, (list, tuple)):
        return False
    module = len(cmd) >= 3 and list(cmd[:2]) == [sys.executable, "-m"]
    if not ((module and _FORKED_HERE["modules"]) or (_is_rank_launch(cmd) and _FORKED_HERE["ranks"])):
        return False
    stdout, stderr = kwargs.get("stdout"), kwargs.get("stderr")
    if subprocess.PIPE in (stdout, stderr) or kwargs.get("stdin") not in (None, subprocess.DEVNULL):
        return False  # (a fork's stdin is /dev/null)
    if set(kwargs) - {"stdout", "stderr", "stdin", "env", "cwd", "text", "encoding", "errors", "start_new_session"}:
        return False
    environ = kwargs.get("env") or os.environ
    return all(environ.get(name) == os.environ.get(name) for name in READ_AT_IMPORT)


class _ForkedChild(ForkedProcess):
    """A forked ``python -m <module>`` child with what :mod:`subprocess` and the demo's runner use."""

    def __init__(
        self, cmd, stdout=None, stderr=None, env=None, cwd=None, stdin=None, start_new_session=False, **_text_options
    ):
        out = 1 if stdout is None else (stdout if isinstance(stdout, int) else stdout.fileno())
        err = (
            out
            if stderr == subprocess.STDOUT
            else (2 if stderr is None else (stderr if isinstance(stderr, int) else stderr.fileno()))
        )
        if cmd[1] == "-m":
            entry, argv, children = partial(_run_module, cmd[2]), [cmd[2], *cmd[3:]], True
        else:  # a rank: the console script again, its children as this process's
            entry, argv, children = _console_script, [str(CLI), *cmd[2:]], _FORKED_HERE["modules"]
        proc = _fork(
            entry,
            argv,
            Path(cwd or os.getcwd()),
            dict(env if env is not None else os.environ),
            out,
            err,
            start_new_session,
            fork_children=children,
            fork_ranks=_FORKED_HERE["ranks"],
        )
        super().__init__(proc.pid, list(cmd))

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def communicate(self, input=None, timeout=None):  # noqa: A002
        self.wait(timeout)
        return None, None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.wait()

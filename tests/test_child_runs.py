"""Commands in child processes (rlhf_lit/child_runs.py), the runner of ``rlhf-lit iterate``, ``rlhf-lit seeds`` and
the demo: the log's header, the exit status, the failure line, a stop that passes the signal on and waits (then
kills), and a pool that keeps job order, stops at a failure and, when stopped, stops every running child.

The children are small Python scripts; the signals are real ones, sent to this process by a timer thread once the
children have said ``ready`` (Python runs the handler in the main thread, which is waiting on them)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from processes import pids_naming, signal_in_popen

from rlhf_lit.child_runs import (
    RunFailed,
    Stopped,
    header,
    last_error,
    rlhf_lit_command,
    run,
    run_pool,
    start,
    stop,
    stop_on_signals,
)


def graceful(delay: float) -> list[str]:
    """A child that says ``ready``, and on SIGTERM or SIGINT says ``got <SIGNAL>``, takes ``delay`` seconds to end
    (as a fit ends its step) and exits with 128 + the signal; left alone it says ``not stopped`` after 20 s."""
    code = (
        "import signal, sys, time\n"
        "def stop(signum, frame):\n"
        "    print('got', signal.Signals(signum).name, flush=True)\n"
        f"    time.sleep({delay})\n"
        "    print('ended', flush=True)\n"
        "    sys.exit(128 + signum)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "signal.signal(signal.SIGINT, stop)\n"
        "print('ready', flush=True)\n"
        "time.sleep(20)\n"
        "print('not stopped', flush=True)\n"
    )
    return [sys.executable, "-c", f"exec({code!r})"]  # one line: the log's header is one line


def said(log: Path) -> list[str]:
    """What a child wrote to its log (the header line left out)."""
    return log.read_text(encoding="utf-8").splitlines()[1:]


def signal_when_ready(logs: list[Path], signum: int, times: int = 1) -> None:
    """Send ``signum`` to this process ``times`` times (0.3 s apart) once every log says ``ready``."""

    def send() -> None:
        deadline = time.monotonic() + 20
        while not all(log.exists() and "ready" in said(log) for log in logs):
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)
        for _ in range(times):
            os.kill(os.getpid(), signum)
            time.sleep(0.3)

    threading.Thread(target=send, daemon=True).start()


def test_a_run_logs_its_command_then_its_output_and_returns_its_exit_status(tmp_path):
    log = tmp_path / "logs" / "a.log"  # the folder is made
    cmd = [sys.executable, "-c", "print('hello'); raise SystemExit(3)"]
    assert run(cmd, log) == 3
    assert run(cmd, log) == 3  # appended
    line = f"$ {sys.executable} -c 'print('\"'\"'hello'\"'\"'); raise SystemExit(3)'"
    assert header(cmd) == line + "\n"
    assert log.read_text(encoding="utf-8").splitlines() == [line, "hello", line, "hello"]
    assert header(rlhf_lit_command(["fit", "--config", "a b.yaml"])) == "$ rlhf-lit fit --config 'a b.yaml'\n"


def test_a_failure_names_the_last_error_of_its_own_run(tmp_path):
    log = tmp_path / "seed_5.log"
    log.write_text(
        "$ rlhf-lit fit a\nrlhf-lit: error: the first run's\n"
        "$ rlhf-lit fit b\nwarming up\nrlhf-lit: error: bad option\ntraceback line\n",
        encoding="utf-8",
    )
    failure = RunFailed("seed 5", 2, log)
    assert str(failure) == f"seed 5 failed (exit status 2): bad option; its log: {log}"
    assert failure.returncode == 2 and failure.tail(2) == "rlhf-lit: error: bad option\ntraceback line\n"
    with open(log, "a", encoding="utf-8") as f:
        f.write("$ rlhf-lit fit c\nKilled\n")
    assert last_error(log) == "Killed"  # the last run's own last line, not an earlier run's error
    with open(log, "a", encoding="utf-8") as f:
        f.write("$ rlhf-lit fit d\n")
    assert last_error(log) == "no output"
    assert last_error(tmp_path / "none.log") == "no log"


def test_stop_gives_a_grace_period_then_kills(tmp_path):
    stubborn_log, graceful_log = tmp_path / "stubborn.log", tmp_path / "graceful.log"
    ignores = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(20)"
    )
    with open(stubborn_log, "w", encoding="utf-8") as a, open(graceful_log, "w", encoding="utf-8") as b:
        stubborn, polite = start([sys.executable, "-c", ignores], a), start(graceful(0.2), b)
    deadline = time.monotonic() + 20
    while not ("ready" in said(stubborn_log) and "ready" in said(graceful_log)) and time.monotonic() < deadline:
        time.sleep(0.02)
    t0 = time.monotonic()
    stop(stubborn, polite, grace_s=1.0)
    assert polite.returncode == 128 + signal.SIGTERM and said(graceful_log) == ["ready", "got SIGTERM", "ended"]
    assert stubborn.returncode == -signal.SIGKILL  # killed once the grace period was over
    assert 1.0 <= time.monotonic() - t0 < 10


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_wait_passes_on_and_waits_for_the_child(tmp_path, capsys, signum):
    """The child gets SIGTERM, whichever signal was received (a fit checkpoints on SIGTERM, not on SIGINT), and is
    waited for to its end; a second signal meanwhile is ignored."""
    name = signal.Signals(signum).name
    before = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    log = tmp_path / "child.log"
    signal_when_ready([log], signum, times=2)
    with pytest.raises(Stopped) as stopped, stop_on_signals("test"):
        run(graceful(1.0), log)
    assert stopped.value.code == 128 + signum
    assert said(log) == ["ready", "got SIGTERM", "ended"]  # (read as soon as the wait is over)
    assert f"rlhf-lit: test stopped by {name} (its running fits too)" in capsys.readouterr().err
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_run_pool_keeps_the_order_and_stops_at_the_first_failure():
    assert run_pool(lambda x: x * x, [3, 1, 2], 2) == [9, 1, 4]
    ran = []
    lock = threading.Lock()

    def job(x: int) -> int:
        with lock:
            ran.append(x)
        if x == 2:
            raise RuntimeError("job 2 failed")
        return x

    with pytest.raises(RuntimeError, match="job 2 failed"):
        run_pool(job, [1, 2, 3, 4], 1)
    assert ran == [1, 2]  # one at a time: the jobs after the failing one never start


def test_a_stopped_pool_stops_every_running_child_waits_for_them_and_starts_no_more(tmp_path):
    """Two jobs in two threads, each running one child and then another; SIGTERM while the first two run: both
    get it and are waited for to their end, neither job starts its second child, the third job never starts."""

    def job(n: int) -> None:
        run(graceful(0.5), tmp_path / f"{n}.log")
        run(graceful(0.5), tmp_path / f"{n}.after.log")

    logs = [tmp_path / "0.log", tmp_path / "1.log"]
    signal_when_ready(logs, signal.SIGTERM)
    t0 = time.monotonic()
    with pytest.raises(Stopped), stop_on_signals("test"):
        run_pool(job, [0, 1, 2], 2)
    assert [said(log) for log in logs] == [["ready", "got SIGTERM", "ended"]] * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0.log", "1.log"]
    assert time.monotonic() - t0 < 15
    assert run([sys.executable, "-c", "pass"], tmp_path / "later.log") == 0  # the next pool's runs start again


def test_ctrl_c_without_the_handlers_stops_a_pool_s_children_with_sigterm(tmp_path):
    """Ctrl-C where :func:`stop_on_signals` is not installed (the demo's studies): KeyboardInterrupt in the wait,
    and the children get SIGTERM (in a session of their own, the terminal's SIGINT never reaches them)."""
    # Python's own SIGINT handler, as in a terminal (a suite started in the background inherits SIGINT ignored).
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        log = tmp_path / "0.log"
        signal_when_ready([log], signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            run_pool(lambda n: run(graceful(0.2), log), [0], 1)
        assert said(log) == ["ready", "got SIGTERM", "ended"]
    finally:
        signal.signal(signal.SIGINT, inherited)


def test_a_child_started_while_a_pool_stops_is_stopped_too(tmp_path, monkeypatch):
    """The pool's stop signals the children it finds; one whose start it missed (started in between) is stopped
    by its own run, with the pool's signal."""
    from rlhf_lit import child_runs

    started = []

    def start_as_the_pool_stops(*args, **kwargs):
        started.append(real_start(*args, **kwargs))
        child_runs.WAITED.stopping = signal.SIGTERM  # the pool's stop began meanwhile
        return started[-1]

    real_start = child_runs.start
    monkeypatch.setattr(child_runs, "start", start_as_the_pool_stops)
    t0 = time.monotonic()
    try:
        with pytest.raises(Stopped):
            run(graceful(0.2), tmp_path / "late.log")
    finally:
        child_runs.WAITED.stopping = None
    assert started[0].returncode is not None and time.monotonic() - t0 < 10  # stopped and reaped, not waited out


def test_a_signal_while_a_child_starts_stops_that_child(tmp_path, monkeypatch, capsys):
    """Raised inside Popen's constructor the signal's exception would leave a running child that Popen never
    returns; held until the child is the run's, it stops the child as any signal during the wait does."""
    marker = f"started-then-signalled-{os.getpid()}"
    signal_in_popen(monkeypatch, signal.SIGTERM)
    with pytest.raises(Stopped) as stopped, stop_on_signals("test"):
        run([sys.executable, "-c", "import time; time.sleep(60)", marker], tmp_path / "child.log")
    assert stopped.value.code == 128 + signal.SIGTERM
    assert pids_naming(marker) == []
    assert "rlhf-lit: test stopped by SIGTERM" in capsys.readouterr().err

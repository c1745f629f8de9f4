"""Where does the test suite spend its CPU? Each test's own CPU and its child processes', summed.

The suite's wall time on 2 cores is bounded below by its CPU time / 2, and much of that CPU is spent
outside the pytest worker: the command-line runs, the two-process launches and the ranks they start,
TorchInductor's ``g++`` calls. pytest's ``--durations`` and the junit times report wall time, which
on a shared machine also counts the waiting. This file is both:

- a pytest plugin (``-p suite_cpu`` with ``bench/`` on ``PYTHONPATH``): for every test it appends one
  JSON line to ``--suite-cpu-log FILE`` with the worker's CPU seconds during the test (setup, call and
  teardown, so a module or session fixture counts in the first test that uses it), the CPU seconds
  its descendant processes spent meanwhile, and its wall seconds. Descendants are those the worker
  waited for (``RUSAGE_CHILDREN``: command-line runs, forked ranks and what they waited for) and
  those still running (read from ``/proc``: TorchInductor's pool of compile workers, which outlives
  the test that first compiles and runs the ``g++`` calls of every later one);
- a report over that file: totals, and the files and tests that used the most CPU.

Commands (from the project root; the log is appended to, so start from an empty one)::

    rm -f cpu.jsonl
    PYTHONPATH=bench make test-all PYTEST_ARGS="-p suite_cpu --suite-cpu-log $PWD/cpu.jsonl"
    python bench/suite_cpu.py cpu.jsonl --top 30

(``make test`` in its place: the tests not marked slow only.)

What it does not count: pytest's start and collection in each worker, and a process that outlives
the worker's knowledge of it (one that exits and is reaped by a process other than the worker or
one of its live descendants). Without ``/proc`` (not Linux) only waited-for children are counted.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import time
from pathlib import Path

import pytest

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc's unit of CPU time per second


def live_descendants_cpu(root: int) -> float:
    """CPU seconds of the processes below ``root`` that are running now: each one's own and that of
    the children it waited for (``/proc/PID/stat`` utime, stime, cutime, cstime). 0 without ``/proc``."""
    children, cpu = collections.defaultdict(list), {}
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", encoding="ascii", errors="replace") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        except OSError:  # it exited meanwhile
            continue
        pid = int(entry.name)
        children[int(fields[1])].append(pid)  # fields[0] is the state, [1] the parent, [11:15] the four times
        cpu[pid] = sum(int(t) for t in fields[11:15]) / TICKS
    below, frontier = [], list(children[root])
    while frontier:
        pid = frontier.pop()
        below.append(pid)
        frontier += children[pid]
    return sum(cpu[pid] for pid in below)


def process_cpu() -> tuple[float, float]:
    """(this process's CPU seconds, its descendants': those it waited for and those still running),
    user + system."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime + live_descendants_cpu(os.getpid())


# ---------------------------------------------------------------- the pytest plugin
def pytest_addoption(parser):
    """``--suite-cpu-log FILE``: where each test's line is appended (no file: nothing is recorded)."""
    parser.addoption("--suite-cpu-log", default=None, help="append one JSON line of CPU seconds per test to this file")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Record the CPU around the whole protocol of one test (a hook wrapper: the run itself is pytest's)."""
    log = item.config.getoption("--suite-cpu-log")
    if not log:
        yield
        return
    own, children, start = *process_cpu(), time.monotonic()
    yield
    own_after, children_after = process_cpu()
    record = {
        "test": item.nodeid,
        "own": round(own_after - own, 3),
        "children": round(children_after - children, 3),
        "wall": round(time.monotonic() - start, 3),
    }
    with open(log, "a", encoding="utf-8") as out:  # one short append per line: two workers may share the file
        out.write(json.dumps(record) + "\n")


# ---------------------------------------------------------------- the report
def read_log(path: Path) -> list[dict]:
    """The records of ``path``, one per test, in the order they were written."""
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            record = json.loads(line)
            records.append({"test": str(record["test"]), **{k: float(record[k]) for k in ("own", "children", "wall")}})
        except (ValueError, KeyError, TypeError) as error:
            raise SystemExit(f"{path}:{number}: not a suite_cpu record ({error}): {line[:120]!r}") from None
    return records


def report(records: list[dict], top: int) -> str:
    """Totals, then the ``top`` files and the ``top`` tests by CPU (own + children)."""

    def cpu(r: dict) -> float:
        return r["own"] + r["children"]

    files: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for r in records:
        entry = files[r["test"].split("::")[0]]
        entry[0] += 1
        entry[1] += r["own"]
        entry[2] += r["children"]
    own, children = sum(r["own"] for r in records), sum(r["children"] for r in records)
    lines = [
        f"{len(records)} tests: {own + children:.0f} s of CPU ({own:.0f} s in the pytest workers, "
        f"{children:.0f} s in the processes they started), {sum(r['wall'] for r in records):.0f} s of wall time",
        "",
        f"{'CPU s':>8} {'own':>7} {'children':>8} {'tests':>5}  file",
    ]
    for name, (n, o, c) in sorted(files.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))[:top]:
        lines.append(f"{o + c:8.1f} {o:7.1f} {c:8.1f} {n:5d}  {name}")
    lines += ["", f"{'CPU s':>8} {'own':>7} {'children':>8} {'wall s':>7}  test"]
    for r in sorted(records, key=lambda r: -cpu(r))[:top]:
        lines.append(f"{cpu(r):8.1f} {r['own']:7.1f} {r['children']:8.1f} {r['wall']:7.1f}  {r['test']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """``python bench/suite_cpu.py LOG [--top N]``: print the report of a log the plugin wrote."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path, help="the file given to --suite-cpu-log")
    parser.add_argument("--top", type=int, default=20, help="how many files and tests to list (default 20)")
    args = parser.parse_args(argv)
    if not args.log.is_file():
        raise SystemExit(f"{args.log}: no such file (run the suite with -p suite_cpu --suite-cpu-log {args.log})")
    print(report(read_log(args.log), args.top))


if __name__ == "__main__":
    main()

"""bench/suite_cpu.py: the plugin records each test's own CPU and its descendant processes' apart (those
waited for, and those still running: a pool like TorchInductor's compile workers), and the report sums
them. Run on a small suite written here whose tests spend known CPU where they say."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from assets_paths import ROOT
from suite_env import subprocess_env

sys.path.insert(0, str(ROOT / "bench"))
import suite_cpu  # noqa: E402  (bench/ is not a package)

BURN = 0.4  # CPU seconds the busy test spends in its own process; twice that in a child
IDLE = 2.0  # seconds the idle test sleeps: more than the pytest process's CPU by then
SCRIPTS = {
    # spends argv[1] seconds of CPU
    "burn.py": (
        "import sys, time\nend = time.process_time() + float(sys.argv[1])\nwhile time.process_time() < end:\n    pass\n"
    ),
    # a compile worker: runs each job (seconds on stdin) as a process of its own, which it waits for
    "worker.py": (
        "import subprocess, sys\nfor seconds in sys.stdin:\n"
        "    subprocess.run([sys.executable, 'burn.py', seconds.strip()], check=True)\n    print('done', flush=True)\n"
    ),
    # a pool that starts the worker and passes jobs on: the pytest process's child, the worker's parent
    "pool.py": (
        "import subprocess, sys\nworker = subprocess.Popen([sys.executable, 'worker.py'], stdin=subprocess.PIPE, "
        "stdout=subprocess.PIPE, text=True)\nfor seconds in sys.stdin:\n    worker.stdin.write(seconds)\n"
        "    worker.stdin.flush()\n    print(worker.stdout.readline(), end='', flush=True)\n"
        "worker.stdin.close()\nworker.wait()\n"
    ),
}
SMALL_SUITE = f'''
import subprocess, sys, time

def test_busy_here():
    end = time.process_time() + {BURN}
    while time.process_time() < end:
        pass

def test_busy_in_a_child():
    subprocess.run([sys.executable, "burn.py", "{2 * BURN}"], check=True)

def test_idle():
    time.sleep({IDLE})

POOL = None  # outlives the test that starts it, as TorchInductor's pool of compile workers does

def test_busy_in_a_live_pool():
    global POOL
    POOL = subprocess.Popen([sys.executable, "pool.py"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    POOL.stdin.write("{2 * BURN}" + chr(10))
    POOL.stdin.flush()
    assert POOL.stdout.readline() == "done" + chr(10)

def test_the_pool_exits():
    POOL.stdin.close()
    assert POOL.wait() == 0
'''


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> list[dict]:
    """The log of ``pytest -p suite_cpu`` over SMALL_SUITE, one JSON record per test."""
    root = tmp_path_factory.mktemp("small-suite")
    (root / "test_small.py").write_text(SMALL_SUITE, encoding="utf-8")
    for name, text in SCRIPTS.items():
        (root / name).write_text(text, encoding="utf-8")
    log = root / "cpu.jsonl"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "suite_cpu",
            "--suite-cpu-log",
            str(log),
            "test_small.py",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env({"PYTHONPATH": str(ROOT / "bench")}),
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]


def test_each_test_gets_its_own_cpu_and_its_childrens_apart(records):
    by_name = {r["test"]: r for r in records}
    assert list(by_name) == [
        f"test_small.py::test_{name}"
        for name in ("busy_here", "busy_in_a_child", "idle", "busy_in_a_live_pool", "the_pool_exits")
    ]
    here, child, idle, live, exits = by_name.values()
    assert here["own"] >= 0.9 * BURN and here["children"] < 0.05  # spent in the pytest process, no child
    assert child["children"] >= 0.9 * 2 * BURN and child["own"] < child["children"] / 2  # the parent only waited
    assert idle["wall"] >= IDLE and idle["own"] < 0.2 and idle["children"] < 0.05  # waiting is no CPU
    assert here["wall"] >= 0.9 * BURN and child["wall"] >= 0.9 * 2 * BURN
    # Processes still running when their test ends count in that test (the pool's worker's waited-for
    # job included), not in the one that reaps them.
    assert live["children"] >= 0.9 * 2 * BURN and live["own"] < live["children"] / 2
    assert exits["children"] < 0.2


def test_the_report_sums_the_records_and_lists_the_most_costly_first(records, tmp_path, capsys):
    log = tmp_path / "cpu.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    suite_cpu.main([str(log), "--top", "5"])
    lines = capsys.readouterr().out.splitlines()
    own, children = sum(r["own"] for r in records), sum(r["children"] for r in records)
    assert lines[0] == (
        f"5 tests: {own + children:.0f} s of CPU ({own:.0f} s in the pytest workers, {children:.0f} s "
        f"in the processes they started), {sum(r['wall'] for r in records):.0f} s of wall time"
    )
    file_line = next(line for line in lines if line.endswith("  test_small.py"))
    assert file_line.split()[:4] == [f"{own + children:.1f}", f"{own:.1f}", f"{children:.1f}", "5"]
    tests = [line.split()[-1] for line in lines if line.split() and line.split()[-1].startswith("test_small.py::")]
    assert tests[0] in ("test_small.py::test_busy_in_a_child", "test_small.py::test_busy_in_a_live_pool")
    assert tests[2] == "test_small.py::test_busy_here"  # the three busy ones first, the costliest first
    assert set(tests) == {r["test"] for r in records}


def test_a_damaged_log_line_is_named_by_file_and_line(tmp_path):
    log = tmp_path / "cpu.jsonl"
    log.write_text(
        json.dumps({"test": "a::b", "own": 1.0, "children": 0.0, "wall": 1.0}) + '\n{"test": "a::c", "own\n',
        encoding="utf-8",
    )
    with pytest.raises(SystemExit, match=rf"^{re.escape(str(log))}:2: not a suite_cpu record"):
        suite_cpu.main([str(log)])
    with pytest.raises(SystemExit, match="no such file"):
        suite_cpu.main([str(tmp_path / "missing.jsonl")])

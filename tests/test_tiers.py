"""The two test tiers: ``make test`` runs the tests not marked ``slow`` and says at its end how to run
the rest, ``make test-all`` and CI run every test; the xdist units go longest first, ranked on the
tests ``-m`` kept (tests/xdist_units.py); a passing test's temporary folder is deleted when it ends."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

from assets_paths import ROOT
from suite_env import subprocess_env
from xdist_units import CHAIN_GROUP, MULTIPROCESS_GROUP, longest_units_first

RECORDER = """#!/bin/sh
printf '%s\\n' "$@" > "$ARGV_FILE"
exit "$EXIT_STATUS"
"""
"""Stands in for the virtual environment's python: writes its arguments, one a line, and exits with
``$EXIT_STATUS``."""


def _make(target: str, tmp_path, status: int) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``make <target>`` with :data:`RECORDER` as its python (and an install stamp newer than what it
    depends on, so nothing is installed): make's result and the arguments pytest was given."""
    python = tmp_path / "python"
    python.write_text(RECORDER)
    python.chmod(0o755)
    stamp = tmp_path / "installed"
    stamp.touch()
    argv = tmp_path / "argv.txt"
    # the caller's make settings (a `make test PYTEST_ARGS=...` running this test) are not this make's
    settings = {"MAKEFLAGS": "", "MFLAGS": "", "ARGV_FILE": str(argv), "EXIT_STATUS": str(status)}
    result = subprocess.run(
        ["make", "--no-print-directory", target, f"PY={python}", f"STAMP={stamp}", "PYTEST_ARGS=", "XDIST="],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=subprocess_env(settings),
    )
    return result, argv.read_text().splitlines()


def _marker_expressions(argv: list[str]) -> list[str]:
    """The ``-m`` expressions of ``python -m pytest <args>``."""
    assert argv[:2] == ["-m", "pytest"], argv
    return [argv[i + 1] for i, arg in enumerate(argv) if i >= 2 and arg == "-m"]


def test_make_test_leaves_out_the_slow_tests_and_ends_naming_make_test_all_passed_or_failed(tmp_path):
    for status in (0, 1):
        result, argv = _make("test", tmp_path, status)
        assert _marker_expressions(argv) == ["not slow"]
        assert (result.returncode == 0) == (status == 0), result.stderr
        last = result.stdout.strip().splitlines()[-1]
        assert "make test-all runs every test" in last, result.stdout


def test_make_test_all_and_ci_run_every_test(tmp_path):
    result, argv = _make("test-all", tmp_path, 0)
    assert result.returncode == 0, result.stderr
    assert _marker_expressions(argv) == []
    steps = [line.split()[1:] for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("step ")]
    assert ["make", "test-all"] in steps and ["make", "test"] not in steps, steps


def _item(nodeid: str, slow: bool = False) -> SimpleNamespace:
    """A collected test as the ordering reads it."""
    return SimpleNamespace(nodeid=nodeid, get_closest_marker=lambda name: object() if slow and name == "slow" else None)


def test_the_two_groups_go_first_then_the_units_with_the_most_slow_tests_then_collection_order():
    items = [
        _item("tests/a/test_one.py::t"),
        _item("tests/b/test_two.py::slow", slow=True),
        _item("tests/b/test_two.py::fast"),
        _item("tests/c/test_three.py::slow_1", slow=True),
        _item("tests/demo/test_frontier.py::t"),  # reads the offline chain
        _item("tests/c/test_three.py::slow_2", slow=True),
        _item("tests/d/test_four.py::t"),
        _item("tests/test_two_ranks.py::t"),  # two processes
    ]
    order = [item.nodeid for item in longest_units_first(items)]
    assert order == [
        "tests/test_two_ranks.py::t",
        "tests/demo/test_frontier.py::t",
        "tests/c/test_three.py::slow_1",
        "tests/c/test_three.py::slow_2",
        "tests/b/test_two.py::slow",
        "tests/b/test_two.py::fast",
        "tests/a/test_one.py::t",
        "tests/d/test_four.py::t",
    ]
    # make test's selection: no slow test left, so b's fast test keeps its place in collection order
    fast = [item for item in items if not item.get_closest_marker("slow")]
    assert [item.nodeid for item in longest_units_first(fast)] == [
        "tests/test_two_ranks.py::t",
        "tests/demo/test_frontier.py::t",
        "tests/a/test_one.py::t",
        "tests/b/test_two.py::fast",
        "tests/d/test_four.py::t",
    ]
    assert {MULTIPROCESS_GROUP, CHAIN_GROUP} == {"two-process-runs", "offline-chain"}


def test_command_is_marked_before_m_selects_and_the_units_are_ordered_after(tmp_path):
    """tests/conftest.py's hook, through pytest itself: ``make test-portable``'s expression leaves out
    the ``command`` tests, and a module whose slow tests ``-m`` left out keeps its collection place."""
    files = ["tests/bench/test_suite_cpu.py", "tests/test_code_lines.py", "tests/demo/test_pipeline.py"]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist", "-p", "no:cacheprovider"]
        + ["-m", "not (slow or command)", *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=subprocess_env(),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    modules = [line.split("::")[0] for line in result.stdout.splitlines() if "::" in line]
    assert files[0] not in modules and set(modules) == set(files[1:]), modules
    assert modules == sorted(modules, key=files.index), modules  # collection order, not slow-first


FOLDER_KEEPER = """
def test_passes(tmp_path):
    (tmp_path / "written").write_text("x")

def test_fails(tmp_path):
    (tmp_path / "written").write_text("x")
    assert False
"""
"""Two tests that write into their temporary folders: one passes, one fails."""


def test_a_passing_test_s_temporary_folder_is_deleted_when_it_ends_a_failing_one_s_kept(tmp_path):
    """The suite's settings (pyproject.toml) bound its disk: the real-model tests write 0.5-1 GB each, and
    kept until the session ends the folders outgrew a CI machine's free disk."""
    (tmp_path / "test_folders.py").write_text(FOLDER_KEEPER)
    base = tmp_path / "base"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider"]
        + ["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), f"--basetemp={base}", "test_folders.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(),
    )
    assert result.returncode == 1 and "1 failed, 1 passed" in result.stdout, result.stdout[-3000:] + result.stderr
    assert sorted(p.parent.name for p in base.rglob("written")) == ["test_fails0"]

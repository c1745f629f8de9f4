"""The demo's side of its runs (``demo/runner.py``): the commands it builds, one logged run in its environment, and
the environment that lets a ``python -m demo`` child start anywhere (the runner itself: tests/test_child_runs.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from demo.plan import ROOT
from demo.runner import child_env, fit_command, rollout_checkpointing, run_logged, seed_overrides, tb_logger
from rlhf_lit.child_runs import RunFailed


def test_the_fit_command_and_its_option_groups(tmp_path):
    assert fit_command("c.yaml", ["--x", "1"]) == [
        sys.executable,
        "-m",
        "rlhf_lit.cli",
        "fit",
        "--config",
        "c.yaml",
        "--x",
        "1",
    ]
    assert tb_logger(tmp_path) == [
        "--trainer.logger.init_args.save_dir",
        str(tmp_path),
        "--trainer.logger.init_args.name",
        "tb",
        "--trainer.logger.init_args.version",
        "0",
    ]
    every = rollout_checkpointing(10, tmp_path)
    assert every[every.index("--trainer.callbacks.every_n_rollouts") + 1] == "10"
    assert every[every.index("--trainer.callbacks.save_top_k") + 1] == "-1"  # every checkpoint kept
    assert "--trainer.callbacks.save_top_k" not in rollout_checkpointing(70, tmp_path, keep_all=False)
    assert seed_overrides(3, rollouts=True)[-2:] == ["--model.init_args.rollout_seed", "3"]


def test_run_logged_writes_the_command_then_its_output_and_names_the_log_on_a_failure(tmp_path):
    log = tmp_path / "log.txt"
    seconds = run_logged([sys.executable, "-c", "print('hello')"], log, "the greeting")
    assert seconds > 0
    lines = log.read_text().splitlines()
    assert lines[0].endswith("-c 'print('\"'\"'hello'\"'\"')'") and lines[1] == "hello"
    with pytest.raises(RunFailed, match=rf"^the exit failed \(exit status 3\): no output; its log: {log}$"):
        run_logged([sys.executable, "-c", "raise SystemExit(3)"], log, "the exit")
    with open(log, "a", encoding="utf-8") as shared:  # an open log: appended to (one run's fit and evaluations)
        run_logged([sys.executable, "-c", "print('again')"], shared, "again")
    assert log.read_text().splitlines()[-1] == "again"


def test_a_demo_child_finds_the_demo_from_any_folder(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", "import demo.plan; print(demo.plan.ROOT)"],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(ROOT) and (ROOT / "assets").is_dir() and (ROOT / "configs" / "demo").is_dir()

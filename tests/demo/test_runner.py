"""The study runner the pipeline and every study share (``demo/runner.py``): the commands it builds, one
logged run, a pool of runs, and the environment that lets a ``python -m demo`` child start anywhere."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from demo.plan import ROOT
from demo.runner import child_env, fit_command, rollout_checkpointing, run_logged, run_pool, seed_overrides, tb_logger


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
    with pytest.raises(RuntimeError, match=rf"^the exit failed \(exit 3\); log: {log}$"):
        run_logged([sys.executable, "-c", "raise SystemExit(3)"], log, "the exit")
    with open(log, "a", encoding="utf-8") as shared:  # an open log: appended to (one run's fit and evaluations)
        run_logged([sys.executable, "-c", "print('again')"], shared, "again")
    assert log.read_text().splitlines()[-1] == "again"


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

"""Two ``rlhf-lit fit`` runs of one stage in one ``--run_dir`` at once: the second refuses in one line
naming the first, and writes nothing; a run killed with SIGKILL leaves no stuck lock
(rlhf_lit/cli/run_lock.py)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import cli_forked
from cli_helpers import TINYSTORIES, error_line, run_main, sft_config, write_yaml

from rlhf_lit.cli.run_lock import LOCK_NAME, RunLock, RunLocked

RUN = "runs/exp1"


def _sft_in_run_dir(cwd: Path, max_steps: int) -> Path:
    """An SFT config whose outputs all lie in ``runs/exp1/sft`` (the export left to ``--run_dir``)."""
    config = sft_config(Path(RUN) / "sft", TINYSTORIES, max_steps=max_steps)
    del config["model"]["init_args"]["export_dir"]  # --run_dir puts it at runs/exp1/sft/model
    return write_yaml(cwd / f"sft-{max_steps}.yaml", config)


def _wait_for_holder(lock: Path, process: cli_forked.ForkedProcess, stderr: Path, timeout_s: float = 60.0) -> dict:
    """The lock file's record once ``process`` has written it (the run then holds the lock)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, stderr.read_text()[-3000:]
        try:
            about = json.loads(lock.read_text())
            if about.get("pid") == process.pid:
                return about
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"the first run took no lock in {timeout_s} s")


def test_a_second_run_on_the_same_run_dir_and_stage_refuses_and_a_killed_run_leaves_no_stuck_lock(tmp_path):
    long_run = _sft_in_run_dir(tmp_path, max_steps=100000)  # runs until it is killed
    first = cli_forked.start(
        ["fit", "--config", long_run.name, "--run_dir", RUN],
        cwd=tmp_path,
        stdout=tmp_path / "first.out",
        stderr=tmp_path / "first.err",
    )
    lock = tmp_path / RUN / "sft" / LOCK_NAME
    try:
        about = _wait_for_holder(lock, first, tmp_path / "first.err")
        second = run_main(
            "fit", "--config", _sft_in_run_dir(tmp_path, max_steps=1).name, "--run_dir", RUN, cwd=tmp_path
        )
        assert second.returncode == 1
        line = error_line(second)
        assert line.startswith(
            f"rlhf-lit: error: --run_dir {RUN}: the SFT stage is already running there (pid "
            f"{first.pid} on {about['host']}, started {about['started']}: rlhf-lit fit --config "
            f"{long_run.name} --run_dir {RUN}); wait for it to end, or give another --run_dir"
        )
        # the refused run wrote nothing: no log folder of its own beside the first run's, no export
        assert not [p for p in (tmp_path / RUN).rglob("version_1")]
        assert not (tmp_path / RUN / "sft" / "model").exists()
    finally:
        first.send_signal(signal.SIGKILL)  # no handler runs: the lock file stays, the kernel drops the lock
        first.wait()
    assert lock.exists()  # what a killed run leaves behind
    third = run_main("fit", "--config", _sft_in_run_dir(tmp_path, max_steps=1).name, "--run_dir", RUN, cwd=tmp_path)
    assert third.returncode == 0, third.stderr[-3000:]
    assert (tmp_path / RUN / "sft" / "model" / "rlhf_lit_export.json").is_file()
    assert not lock.exists()  # removed when the run ended


def test_the_lock_is_released_by_a_run_that_fails_and_taken_over_from_a_removed_file(tmp_path):
    folder = str(tmp_path / "stage")
    held = RunLock(folder, "the stage", ["rlhf-lit", "fit"])
    try:
        RunLock(folder, "the stage", ["rlhf-lit", "fit", "again"])
        raise AssertionError("a second lock was granted")
    except RunLocked as refusal:
        assert f"pid {os.getpid()} on " in str(refusal) and ": rlhf-lit fit); wait for it to end" in str(refusal)
    held.release()
    assert not os.path.exists(folder)  # created by the lock, removed with it
    again = RunLock(folder, "the stage")
    again.release()
    # A run that fails after taking the lock (here: a refused config) releases it: the next run starts.
    write_yaml(
        tmp_path / "bad.yaml",
        {"model": {"class_path": "rlhf_lit.stages.SFTModule", "init_args": {"model": str(tmp_path / "nowhere")}}},
    )
    for _ in range(2):
        result = run_main(
            "fit", "--config", _sft_in_run_dir(tmp_path, 1).name, "--config", "bad.yaml", "--run_dir", RUN, cwd=tmp_path
        )
        assert result.returncode == 1 and "already running" not in result.stderr, result.stderr[-3000:]
    assert not (tmp_path / RUN / "sft" / LOCK_NAME).exists()


def test_the_lock_never_writes_through_a_link_nor_removes_a_file_put_at_its_name(tmp_path):
    """The lock file is truncated when taken and removed when released: neither may reach a user's file."""
    folder = tmp_path / "stage"
    folder.mkdir()
    users = tmp_path / "notes.txt"
    users.write_text("the user's notes\n")
    (folder / LOCK_NAME).symlink_to(users)
    try:
        RunLock(str(folder), "the stage")
        raise AssertionError("a lock through a symbolic link was granted")
    except RunLocked as refusal:
        assert f"the lock file {folder / LOCK_NAME} cannot be opened as a plain file" in str(refusal)
    assert users.read_text() == "the user's notes\n" and (folder / LOCK_NAME).is_symlink()
    (folder / LOCK_NAME).unlink()
    held = RunLock(str(folder), "the stage")
    os.replace(users, folder / LOCK_NAME)  # something else now stands at the lock's name
    held.release()
    assert (folder / LOCK_NAME).read_text() == "the user's notes\n"  # not removed: not the file the lock wrote

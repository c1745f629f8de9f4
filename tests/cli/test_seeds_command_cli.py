"""`rlhf-lit seeds`: one run per seed in DIR/seed_S, resumable, stopping at the first failure, and a signal passed
on to its running fits, none outliving it."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
from pathlib import Path

import cli_forked
import pytest
from cli_helpers import error_line, run_main
from lightning.pytorch import Callback
from offline_chain import SFT


@pytest.fixture
def forked_runs(monkeypatch):
    """The command's runs (``python -m rlhf_lit.cli fit ...``) forked from this process rather than
    started anew (tests/cli_forked.py): processes of their own without the imports' cost."""
    monkeypatch.setattr(subprocess, "Popen", cli_forked.ForkingPopen)


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_seeds_runs_the_tiny_sft_once_per_seed_and_skips_finished_ones(tmp_path, forked_runs):
    command = ["seeds", "--seeds", "1", "2", "--", *SFT, "--run_dir", "runs/exp"]
    result = run_main(*command[:4], "--jobs", "2", *command[4:], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    exports = {s: tmp_path / "runs" / "exp" / f"seed_{s}" / "sft" / "model" for s in (1, 2)}
    assert all((export / "rlhf_lit_export.json").is_file() for export in exports.values())
    assert _digest(exports[1] / "model.safetensors") != _digest(exports[2] / "model.safetensors")
    for s in (1, 2):
        assert f"seed {s}: done: runs/exp/seed_{s} (log runs/exp/seed_{s}.log)" in result.stdout
        assert f"--seed_everything {s}" in (tmp_path / "runs" / "exp" / f"seed_{s}.log").read_text()

    # Rerun (one after another): the finished seeds are skipped, their exports and logs untouched.
    logs = {s: tmp_path / "runs" / "exp" / f"seed_{s}.log" for s in (1, 2)}
    before = {s: (_digest(exports[s] / "model.safetensors"), logs[s].read_text()) for s in (1, 2)}
    again = run_main(*command, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.splitlines() == [
        f"seed {s}: skipped, runs/exp/seed_{s}/sft/model holds a finished export (rlhf_lit_export.json)" for s in (1, 2)
    ]
    assert before == {s: (_digest(exports[s] / "model.safetensors"), logs[s].read_text()) for s in (1, 2)}


def test_seeds_stops_at_the_first_failure_naming_the_seed_and_its_log(tmp_path, forked_runs):
    result = run_main(
        "seeds", "--seeds", "5", "6", "--", *SFT, "--trainer.max_stepz", "3", "--run_dir", "runs/bad", cwd=tmp_path
    )
    assert result.returncode == 1
    assert error_line(result) == (
        "rlhf-lit: error: seed 5 failed (exit status 2): unknown option --trainer.max_stepz; "
        "did you mean --trainer.max_steps?; its log: runs/bad/seed_5.log"
    )
    assert "seed 6" not in result.stdout and not (tmp_path / "runs" / "bad" / "seed_6.log").exists()


def test_seeds_refuses_a_bad_option_before_any_run(tmp_path):
    cases = {
        ("--seeds", "1", "--", *SFT): "the command after -- needs one --run_dir DIR (each seed runs in DIR/seed_S)",
        (
            "--seeds",
            "1",
            "--",
            *SFT,
            "--run_dir",
            "r",
            "--seed_everything",
            "3",
        ): "the command after -- sets --seed_everything; rlhf-lit seeds sets it per seed",
        ("--seeds", "1", "1", "--", *SFT, "--run_dir", "r"): "--seeds: a seed is given twice (1 1)",
        ("--seeds", "1", "--jobs", "0", "--", *SFT, "--run_dir", "r"): "--jobs must be at least 1, got 0",
        ("--seeds", "1"): "give the command to run after --, e.g. -- fit --config X.yaml --run_dir runs/exp",
        ("--seeds", "x", "--", *SFT, "--run_dir", "r"): "argument --seeds: invalid int value: 'x'",
        # Lightning refuses these in each run, naming no option; seeds would have started a run for each
        ("--seeds", "0", "-5", "--", *SFT, "--run_dir", "r"): (
            "--seeds -5: a run seed must be in [0, 4294967295] (the seeds numpy takes)"
        ),
    }
    for argv, message in cases.items():
        result = run_main("seeds", *argv, cwd=tmp_path)
        assert result.returncode == 2, (argv, result.stderr)
        assert error_line(result) == f"rlhf-lit: error: {message}", argv
    assert not (tmp_path / "r").exists()


class MidRun(Callback):
    """Marks a fit as mid-run: at its second training batch it writes its pid's start time to ``<folder>/<pid>``
    (``/proc/<pid>/stat``), then every batch pauses ``pause_s`` so that it stays mid-run while a test signals."""

    def __init__(self, folder: str, pause_s: float = 0.2) -> None:
        self.folder, self.pause_s, self.batches = Path(folder), pause_s, 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        """Counts batches; writes the mark at the second, then pauses."""
        self.batches += 1
        if self.batches == 2:
            pid = os.getpid()
            (self.folder / f".{pid}").write_text(str(_started(pid)), encoding="utf-8")
            (self.folder / f".{pid}").rename(self.folder / str(pid))  # whole when the test reads it
        time.sleep(self.pause_s)


def _started(pid: int) -> str | None:
    """The start time of the process ``pid`` (``/proc/<pid>/stat`` field 22); None when none runs under that pid
    (or only what is left of an ended one)."""
    try:
        state, *rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if state in ("Z", "X") else rest[18]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_seeds_reaches_its_running_fits_and_none_outlives_it(tmp_path, signum):
    """``rlhf-lit seeds --jobs 2`` (a process of its own session, its fits forked from it: tests/cli_forked.py),
    signalled while both fits train: it passes the signal on, waits for them, exits with 128 + the signal, and
    neither fit's pid runs after it (a fit left running would hold its run directory's lock)."""
    name = signal.Signals(signum).name
    marks = tmp_path / "mid_run"
    marks.mkdir()
    fit = [*SFT, "--trainer.max_steps", "100000", "--trainer.callbacks+=test_seeds_command_cli.MidRun"]
    fit += ["--trainer.callbacks.folder", str(marks), "--run_dir", "runs/exp"]
    command = ["seeds", "--seeds", "1", "2", "--jobs", "2", "--", *fit]
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    proc = cli_forked.start(command, cwd=tmp_path, stdout=out, stderr=err, new_session=True, fork_children=True)
    try:
        deadline = time.monotonic() + 60
        while len([p for p in marks.iterdir() if p.name.isdigit()]) < 2:  # both fits mid-run
            assert proc.poll() is None, err.read_text()[-3000:]
            assert time.monotonic() < deadline, "the fits did not reach their second batch within 60 s"
            time.sleep(0.05)
        fits = {int(p.name): p.read_text(encoding="utf-8") for p in marks.iterdir() if p.name.isdigit()}
        assert all(_started(pid) == started for pid, started in fits.items())  # running now
        proc.send_signal(signum)
        status = proc.wait(timeout=120)
        outlived = [pid for pid, started in fits.items() if _started(pid) == started]
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of its session
        except ProcessLookupError:
            pass
        if proc.poll() is None:
            proc.wait()
    stderr = err.read_text()
    assert status == 128 + signum, stderr[-3000:]
    assert f"rlhf-lit: seeds stopped by {name} (its running fits too)" in stderr
    assert outlived == []  # no fit runs after it
    for seed in (1, 2):
        log = (tmp_path / "runs" / "exp" / f"seed_{seed}.log").read_text()
        if signum == signal.SIGTERM:  # the fit got it: it ended its step and wrote last.ckpt (Preemption)
            assert "[rlhf-lit] stopped by SIGTERM after step" in log, log[-3000:]

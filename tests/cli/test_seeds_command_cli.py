"""`rlhf-lit seeds`: one run per seed in DIR/seed_S, resumable, stopping at the first failure."""

from __future__ import annotations

import hashlib
import subprocess

import cli_forked
import pytest
from cli_helpers import error_line, run_main
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


@pytest.mark.slow
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
    }
    for argv, message in cases.items():
        result = run_main("seeds", *argv, cwd=tmp_path)
        assert result.returncode == 2, (argv, result.stderr)
        assert error_line(result) == f"rlhf-lit: error: {message}", argv
    assert not (tmp_path / "r").exists()

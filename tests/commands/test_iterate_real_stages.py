"""``rlhf-lit iterate`` over the real stages, in this process (``rlhf_lit.cli.main`` through ``run_main``),
1-2 steps each: the loop end to end, a kill in the middle of a fit that a rerun finishes with the same export,
and SIGTERM to the console script while a fit runs (the loop's own decisions: test_iterate.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from assets_paths import STORIES260K, TINYSTORIES
from cli_in_process import run_main
from iterate_helpers import FakeFits, in_process_fits, iterate, loop_config
from processes import pids_naming

from rlhf_lit.artifacts import EXPORT_MARKER
from rlhf_lit.commands import iterate_command

# ------------------------------------------------------------------------------ the real stages


TINY_FITS = {
    "reward_model": {
        "options": [
            "--trainer.max_epochs",
            "1",
            "--trainer.max_steps",
            "2",
            "--data.init_args.batch_size",
            "2",
            "--data.init_args.val_fraction",
            "0.34",
        ]
    },
    "ppo": {
        "options": [
            "--model.init_args.max_rollouts",
            "1",
            "--model.init_args.sampling.max_new_tokens",
            "6",
            "--model.init_args.ppo.epochs",
            "1",
            "--model.init_args.ppo.minibatch_size",
            "2",
            "--data.init_args.batch_size",
            "4",
            "--data.init_args.max_records",
            "16",
            "--data.init_args.train_path",
            str(TINYSTORIES),
        ]
    },
}
"""1-2 steps per stage: the shipped stage configs, shortened through the loop's ``options``."""


def weights(export: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(export / "model.safetensors"))


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """The loop over the real stages, T = 2, in this process: ``(run directory, result)``."""
    root = tmp_path_factory.mktemp("real")
    result = run_main_with(loop_config(root, **TINY_FITS), in_process_fits, root)
    return root / "run", result


def run_main_with(config: Path, runner, cwd: Path):
    """``rlhf-lit iterate`` with ``runner`` as the fits (a module-scoped fixture has no monkeypatch)."""
    saved = iterate_command.run_fit
    iterate_command.run_fit = runner
    try:
        return run_main("iterate", "--config", str(config), cwd=cwd)
    finally:
        iterate_command.run_fit = saved


QUIET_TINY_RUN = pytest.mark.filterwarnings("ignore:The variance of predictions or target is close to zero")
"""A 6-token response budget cuts every response at 6 tokens: the RM's length correlation has no variance."""


@QUIET_TINY_RUN
def test_the_loop_runs_the_real_stages(real_run):
    run, result = real_run
    assert result.returncode == 0, result.stderr[-3000:]
    for t in (1, 2):
        for stage in ("reward_model", "ppo"):
            assert (run / f"iter_{t}" / stage / "model" / EXPORT_MARKER).is_file()
    rows = json.loads((run / "summary.json").read_text(encoding="utf-8"))["rows"]
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-4)  # the SFT model against itself
    assert rows[2]["rm_acc_before"] is not None and rows[2]["rm_acc_after"] is not None
    assert all(row["gold"] is not None and row["kl"] is not None for row in rows)
    assert all(row["ppo_judge"] is not None and row["guard_fired"] is not None for row in rows[1:])  # PPO's own logs
    assert "rm_acc_before" in result.stdout  # the printed table


@QUIET_TINY_RUN
def test_a_kill_in_the_middle_of_a_fit_resumes_to_the_same_export(tmp_path, monkeypatch, real_run, tiny_rm):
    """Killed in iteration 1's PPO fit (a checkpoint folder and a temporary export left): the rerun skips the
    finished reward model, fits PPO again and ends with the export an uninterrupted run has."""
    run, _ = real_run
    config = loop_config(tmp_path, iterations=1, **TINY_FITS)
    calls = []

    def killed_in_ppo(args, log_path):
        calls.append(args)
        if "--model.init_args.sft_model" in args:
            return FakeFits(tiny_rm, kill_at=(1, "ppo"))(args, log_path)
        return in_process_fits(args, log_path)

    assert iterate(config, killed_in_ppo, monkeypatch, tmp_path).returncode == 1
    assert len(calls) == 2 and (tmp_path / "run" / "iter_1" / "reward_model" / "model" / EXPORT_MARKER).is_file()
    resumed = iterate(config, in_process_fits, monkeypatch, tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "iteration 1: reward_model: done" in resumed.stdout
    got, want = weights(tmp_path / "run" / "iter_1" / "ppo" / "model"), weights(run / "iter_1" / "ppo" / "model")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    base = weights(STORIES260K)
    assert any(not torch.equal(want[k], base[k]) for k in want if k in base)  # PPO did change the policy


@pytest.mark.slow
@QUIET_TINY_RUN
def test_sigterm_stops_the_loop_and_its_fit_and_a_rerun_finishes(tmp_path, monkeypatch):
    """The console script, SIGTERM while a fit runs: exit 143, no fit left running (its lock would refuse the
    rerun), and the same command again finishes the loop (here in process)."""
    import signal
    import subprocess
    import sys
    import time

    from suite_env import subprocess_env

    config = loop_config(tmp_path, iterations=1, **TINY_FITS)
    cli = Path(sys.executable).parent / "rlhf-lit"
    import os

    path = os.pathsep.join(p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH")) if p)  # the judge
    loop = subprocess.Popen(
        [str(cli), "iterate", "--config", str(config)],
        cwd=tmp_path,
        env=subprocess_env({"PYTHONPATH": path}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    log = tmp_path / "run" / "iter_1" / "reward_model.log"
    deadline = time.monotonic() + 120
    while not log.exists() and loop.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert log.exists(), loop.communicate()
    time.sleep(1.0)  # the fit is starting
    loop.send_signal(signal.SIGTERM)
    _, stderr = loop.communicate(timeout=120)
    assert loop.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "stopped by SIGTERM" in stderr
    assert pids_naming(str(tmp_path / "run")) == []  # the fit went with it
    resumed = iterate(config, in_process_fits, monkeypatch, tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (tmp_path / "run" / "iter_1" / "ppo" / "model" / EXPORT_MARKER).is_file()

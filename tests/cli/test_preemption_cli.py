"""Preemption through the command line: SIGTERM or SIGUSR1 stops a run at the end of its optimizer
step (SFT) or rollout (PPO) with ``last.ckpt`` written, one line saying where it is and how to
resume, and exit status 128 + the signal; the logged resume command (the README's) then ends
exactly where an uninterrupted run ends: the exports are equal byte for byte.

The signal is sent from outside to a real process once the run has made progress (its first
checkpoint is on disk), wherever the run then is; and from inside a run made in this process at
the awkward points: in the middle of a PPO update, between two batches of gradient accumulation.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import time
from pathlib import Path

import cli_forked
import pytest
import torch
from cli_helpers import (
    STORIES,
    TINYSTORIES,
    TWO_PROCESS_ROLLOUTS,
    error_line,
    ppo_config,
    rlhf_lit_forked,
    run_main,
    sft_config,
    two_process_ppo,
    write_yaml,
)

ROLLOUTS = 8
STEPS = 24  # SFT optimizer steps of 2 batches each (accumulate_grad_batches: 2), 6 epochs of 4 steps
STOP_LINE = re.compile(
    r"^\[rlhf-lit\] stopped by (SIG\w+) after (rollout|step) (\d+): checkpoint (.+); resume with: (.+)$"
)
EXPORT_MARKER = "rlhf_lit_export.json"  # what and when: its time differs between two runs


def _ppo(root: Path, rm: str, *callbacks: dict) -> Path:
    config = ppo_config(root, STORIES, rm, max_rollouts=ROLLOUTS)
    config["trainer"]["callbacks"] += list(callbacks)
    return write_yaml(root / "ppo.yaml", config)


def _sft(root: Path, *callbacks: dict) -> Path:
    config = sft_config(root, TINYSTORIES, max_steps=STEPS)
    config["trainer"]["accumulate_grad_batches"] = 2
    config["trainer"]["callbacks"] += list(callbacks)
    return write_yaml(root / "sft.yaml", config)


def _send(name: str, hook: str, at: int) -> dict:
    """A callback that sends signal ``name`` to the run's own process at the ``at``-th ``hook`` call."""
    return {"class_path": "signal_sender.SendSignal", "init_args": {"signal": name, "hook": hook, "at": at}}


def _straight(root: Path, config: Path) -> Path:
    result = run_main("fit", "--config", str(config), cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "stopped by" not in result.stderr
    return root


@pytest.fixture(scope="module")
def straight_ppo(tmp_path_factory, stories_rm) -> Path:
    """An uninterrupted PPO run of :data:`ROLLOUTS` rollouts."""
    root = tmp_path_factory.mktemp("straight-ppo")
    return _straight(root, _ppo(root, stories_rm))


@pytest.fixture(scope="module")
def straight_sft(tmp_path_factory) -> Path:
    """An uninterrupted SFT run of :data:`STEPS` steps."""
    root = tmp_path_factory.mktemp("straight-sft")
    return _straight(root, _sft(root))


def _stop_line(stderr: str) -> tuple[str, str, int, str, str]:
    """(signal, unit, count, checkpoint, resume command) of the one stop line; no traceback."""
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [m for m in map(STOP_LINE.match, stderr.splitlines()) if m]
    assert len(lines) == 1, stderr[-3000:]
    name, unit, count, checkpoint, command = lines[0].groups()
    return name, unit, int(count), checkpoint, command


def _checked_stop(stderr: str, root: Path, config: str, name: str, unit: str) -> tuple[int, dict, str]:
    """Check the stop line against the run: its checkpoint is ``ckpt/last.ckpt``, the command is the
    run's own with ``--ckpt_path`` added, no export was written. Returns the count, the checkpoint
    and the command."""
    said, said_unit, count, checkpoint, command = _stop_line(stderr)
    assert (said, said_unit) == (name, unit)
    assert os.path.realpath(checkpoint) == os.path.realpath(root / "ckpt" / "last.ckpt")
    assert command == shlex.join(["rlhf-lit", "fit", "--config", config, "--ckpt_path", checkpoint])
    assert not (root / "export").exists()  # an unfinished run exports nothing
    assert not list((root / "ckpt").glob(".*.tmp"))  # written whole, renamed into place
    return count, torch.load(checkpoint, map_location="cpu", weights_only=True), command


def _resume(root: Path, command: str, processes: int = 1) -> None:
    """Run the logged command (``rlhf-lit`` and its arguments): through the console script's entry in
    this process, or in a process of its own under ddp (its launcher starts the other rank)."""
    program, *args = shlex.split(command)
    assert program == "rlhf-lit"
    result = run_main(*args, cwd=root) if processes == 1 else rlhf_lit_forked(*args, cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]


def _assert_same_export(straight: Path, resumed: Path) -> None:
    names = sorted(p.name for p in straight.iterdir())
    assert names == sorted(p.name for p in resumed.iterdir()) and "model.safetensors" in names
    for name in names:
        if name != EXPORT_MARKER:
            assert (straight / name).read_bytes() == (resumed / name).read_bytes(), name


def _start(root: Path, config: str) -> tuple[cli_forked.ForkedProcess, Path]:
    """``rlhf-lit fit --config <config>`` in a process of its own session (forked: tests/cli_forked.py);
    stderr goes to a file."""
    log = root / "stderr.txt"
    proc = cli_forked.start(
        ["fit", "--config", config], cwd=root, stdout=root / "stdout.txt", stderr=log, new_session=True
    )
    return proc, log


def _signal_after_first_checkpoint(proc: cli_forked.ForkedProcess, root: Path, signum: int) -> int:
    """Wait (at most 300 s) until the run's first ``last.ckpt`` exists, send ``signum`` to the
    process, and return its exit status (waiting at most 300 s more)."""
    deadline = time.monotonic() + 300
    try:
        while not (root / "ckpt" / "last.ckpt").exists():
            assert proc.poll() is None, "the run ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it was signalled"
        proc.send_signal(signum)
        return proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_ppo_sigterm_stops_after_the_rollout_and_the_logged_command_resumes_it_exactly(
    straight_ppo, stories_rm, tmp_path
):
    _ppo(tmp_path, stories_rm)
    proc, log = _start(tmp_path, "ppo.yaml")
    assert _signal_after_first_checkpoint(proc, tmp_path, signal.SIGTERM) == 128 + signal.SIGTERM
    rollouts, checkpoint, command = _checked_stop(log.read_text(), tmp_path, "ppo.yaml", "SIGTERM", "rollout")
    assert 1 <= rollouts <= ROLLOUTS and checkpoint["ppo"]["rollout_index"] == rollouts

    _resume(tmp_path, command)
    _assert_same_export(straight_ppo / "export", tmp_path / "export")
    final, expected = (
        torch.load(root / "ckpt" / "last.ckpt", map_location="cpu", weights_only=True)
        for root in (tmp_path, straight_ppo)
    )
    assert final["ppo"]["kl_controller"] == expected["ppo"]["kl_controller"]
    assert final["PromptDataModule"] == expected["PromptDataModule"]  # the data position


def test_sft_sigterm_stops_after_the_optimizer_step_and_the_logged_command_resumes_it_exactly(straight_sft, tmp_path):
    _sft(tmp_path)
    proc, log = _start(tmp_path, "sft.yaml")
    assert _signal_after_first_checkpoint(proc, tmp_path, signal.SIGTERM) == 128 + signal.SIGTERM
    steps, checkpoint, command = _checked_stop(log.read_text(), tmp_path, "sft.yaml", "SIGTERM", "step")
    assert 2 <= steps <= STEPS and checkpoint["global_step"] == steps

    _resume(tmp_path, command)
    _assert_same_export(straight_sft / "export", tmp_path / "export")


def test_sigusr1_in_the_middle_of_a_ppo_update_stops_after_that_rollout(straight_ppo, stories_rm, tmp_path):
    # Rollout 2 makes optimizer steps 9 to 16 (2 PPO epochs x 2 minibatches x policy and critic):
    # the signal comes at its 3rd, after the policy and the critic have both stepped once.
    _ppo(tmp_path, stories_rm, _send("SIGUSR1", "on_before_optimizer_step", at=11))
    before = signal.getsignal(signal.SIGUSR1)
    result = run_main("fit", "--config", "ppo.yaml", cwd=tmp_path)
    assert result.returncode == 128 + signal.SIGUSR1
    assert signal.getsignal(signal.SIGUSR1) == before  # the process's own handler is back
    rollouts, checkpoint, command = _checked_stop(result.stderr, tmp_path, "ppo.yaml", "SIGUSR1", "rollout")
    assert rollouts == checkpoint["ppo"]["rollout_index"] == 2  # the rollout was finished, not abandoned
    assert checkpoint["global_step"] == 16

    _ppo(tmp_path, stories_rm)  # the same config without the sender (it would count its calls from 1 again)
    _resume(tmp_path, command)
    _assert_same_export(straight_ppo / "export", tmp_path / "export")


def test_sigterm_between_two_batches_of_gradient_accumulation_stops_after_the_step(straight_sft, tmp_path):
    # batch 5 is the first of step 3's two: the step is finished, not cut in half
    _sft(tmp_path, _send("SIGTERM", "on_train_batch_start", at=5))
    result = run_main("fit", "--config", "sft.yaml", cwd=tmp_path)
    assert result.returncode == 128 + signal.SIGTERM
    steps, checkpoint, command = _checked_stop(result.stderr, tmp_path, "sft.yaml", "SIGTERM", "step")
    assert steps == checkpoint["global_step"] == 3
    assert checkpoint["SFTDataModule"]["sampler"]["consumed"] == 6 * 4  # 6 batches of 4 examples

    _sft(tmp_path)  # the same config without the sender
    _resume(tmp_path, command)
    _assert_same_export(straight_sft / "export", tmp_path / "export")


def test_a_signal_during_the_last_rollout_or_step_lets_the_run_finish_and_export(
    straight_ppo, straight_sft, stories_rm, tmp_path
):
    # PPO's last rollout makes optimizer steps 57 to 64; SFT's last step takes batches 47 and 48.
    for root, config, sender, straight in (
        (tmp_path / "ppo", "ppo.yaml", _send("SIGUSR1", "on_before_optimizer_step", at=8 * ROLLOUTS - 5), straight_ppo),
        (tmp_path / "sft", "sft.yaml", _send("SIGTERM", "on_train_batch_start", at=2 * STEPS - 1), straight_sft),
    ):
        if config == "ppo.yaml":
            _ppo(root, stories_rm, sender)
        else:
            _sft(root, sender)
        result = run_main("fit", "--config", config, cwd=root)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "stopped by" not in result.stderr
        _assert_same_export(straight / "export", root / "export")


@pytest.mark.filterwarnings("ignore:No seed found, seed set to")  # Lightning's choice for `true`, said on purpose
def test_a_random_run_seed_is_in_the_logged_resume_command(tmp_path):
    # --seed_everything true lets Lightning choose a seed the data order follows: the resume must use that one
    _sft(tmp_path, _send("SIGTERM", "on_train_batch_start", at=3))
    result = run_main("fit", "--config", "sft.yaml", "--seed_everything", "true", cwd=tmp_path)
    assert result.returncode == 128 + signal.SIGTERM
    *_, command = _stop_line(result.stderr)
    drawn = re.search(r" --seed_everything true --seed_everything (\d+) --ckpt_path ", command)
    assert drawn, command
    _sft(tmp_path)  # the same config without the sender
    _resume(tmp_path, command)


def test_a_random_run_seed_is_refused_when_a_launcher_started_the_processes(tmp_path):
    _sft(tmp_path)
    result = run_main("fit", "--config", "sft.yaml", "--seed_everything", "true", cwd=tmp_path, env={"WORLD_SIZE": "2"})
    assert result.returncode == 2
    assert "--seed_everything true leaves the seed to each of the 2 processes" in error_line(result)


def test_a_sigterm_before_training_begins_exits_143_in_one_line_with_nothing_saved(tmp_path):
    # During the sanity check Lightning's own handler is still in place: it stops the run without a
    # step taken, which rlhf-lit reports as a stop, not as a finished run (Lightning exits with 0).
    config = sft_config(tmp_path, TINYSTORIES, data={"val_fraction": 0.25})
    config["trainer"]["callbacks"].append(_send("SIGTERM", "on_validation_batch_start", at=1))
    write_yaml(tmp_path / "sft.yaml", config)
    result = run_main("fit", "--config", "sft.yaml", cwd=tmp_path)
    assert result.returncode == 128 + signal.SIGTERM
    lines = [line for line in result.stderr.splitlines() if line.startswith("rlhf-lit: stopped by SIGTERM")]
    assert lines == [
        "rlhf-lit: stopped by SIGTERM before training began; nothing new to save, run the same command again"
    ]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "ckpt" / "last.ckpt").exists() and not (tmp_path / "export").exists()


@pytest.mark.slow
def test_under_ddp_a_sigterm_to_rank_0_alone_stops_both_ranks_after_the_same_rollout(
    tmp_path, straight_ddp, stories_rm
):
    """As Kubernetes does (only the container's main process is signalled): rank 1 learns of the stop
    from rank 0 at the end of the rollout, both write their part of the checkpoint and exit; the
    logged command resumes both to the end of the uninterrupted run (tests/cli/conftest.py)."""
    two_process_ppo(tmp_path, stories_rm, "ddp")  # after the first checkpoint, 3 rollouts to be signalled in
    proc, log = _start(tmp_path, "ppo.yaml")
    # rank 0 is the process started here; rank 1 is its child and gets no signal (a hang would time out)
    assert _signal_after_first_checkpoint(proc, tmp_path, signal.SIGTERM) == 128 + signal.SIGTERM
    rollouts, checkpoint, command = _checked_stop(log.read_text(), tmp_path, "ppo.yaml", "SIGTERM", "rollout")
    assert 1 <= rollouts <= TWO_PROCESS_ROLLOUTS and checkpoint["ppo"]["rollout_index"] == rollouts
    assert checkpoint["ppo"]["world_size"] == 2

    _resume(tmp_path, command, processes=2)
    _assert_same_export(straight_ddp / "export", tmp_path / "export")

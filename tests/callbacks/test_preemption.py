"""The pieces of the preemption stop that a run does not show by itself (the stop itself is tested
through the command line: tests/cli/test_preemption_cli.py)."""

import signal

from rlhf_lit.callbacks.preemption import exit_status, resume_command


def test_the_resume_command_is_the_run_command_with_its_ckpt_path_replaced():
    ckpt = "/runs/a b/ckpt/last.ckpt"
    assert resume_command(["rlhf-lit", "fit", "--config", "ppo.yaml"], ckpt) == (
        "rlhf-lit fit --config ppo.yaml --ckpt_path '/runs/a b/ckpt/last.ckpt'"
    )
    # a resumed run stopped again: its old checkpoint (both spellings) gives way to the new one
    for old in (["--ckpt_path", "old.ckpt"], ["--ckpt_path=old.ckpt"]):
        command = ["rlhf-lit", "fit", "--config", "ppo.yaml", *old, "--run_dir", "runs/x"]
        assert (
            resume_command(command, "new.ckpt")
            == "rlhf-lit fit --config ppo.yaml --run_dir runs/x --ckpt_path new.ckpt"
        )


def test_the_exit_status_is_a_shells_for_a_process_that_signal_killed():
    assert exit_status(signal.SIGTERM) == 143 and exit_status(signal.SIGUSR1) == 138

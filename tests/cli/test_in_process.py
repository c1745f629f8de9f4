"""The in-process runner of the CLI tests (tests/cli_in_process.py) leaves the test process as it found it.

main() sets the debug switch in the environment, installs warnings filters and a log handler,
seeds every random generator and changes transformers' progress bar; a test that ran it in process
must not change what the next test sees.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import warnings

import numpy as np
import torch
from cli_helpers import STORIES, TINYSTORIES, error_line, run_main, sft_config, write_yaml
from transformers.utils import logging as hf_logging

import rlhf_lit.cli


def _state() -> dict:
    """What main() may change in the process, copied."""
    return {
        "environ": dict(os.environ),
        "argv": list(sys.argv),
        "cwd": os.getcwd(),
        "filters": list(warnings.filters),
        "handlers": {n: list(logging.getLogger(n).handlers) for n in ("rlhf_lit", "lightning.pytorch")},
        "level": logging.getLogger("rlhf_lit").level,
        "debug": rlhf_lit.cli._debug,
        "bar": hf_logging.is_progress_bar_enabled(),
        "threads": torch.get_num_threads(),
        "torch_rng": torch.random.get_rng_state(),
        "random": random.getstate(),
        "numpy": np.random.get_state()[1].copy(),
    }


def _assert_same(before: dict, after: dict) -> None:
    """Every entry of two :func:`_state` copies is equal."""
    for key in before:
        if key == "torch_rng":
            assert torch.equal(before[key], after[key]), key
        elif key == "numpy":
            assert np.array_equal(before[key], after[key]), key
        else:
            assert before[key] == after[key], key


def test_a_run_with_the_debug_switch_and_a_fit_leave_no_trace(tmp_path):
    before = _state()
    debug = run_main("fit", "--model.init_args.lora.r", "x", "--debug", cwd=tmp_path, env={"RLHF_LIT_DEBUG": "1"})
    assert debug.returncode == 2 and "lora.r" in debug.stderr  # an option error, reported in full (--debug)
    write_yaml(tmp_path / "sft.yaml", sft_config(tmp_path, TINYSTORIES, max_steps=1))
    fitted = run_main("fit", "--config", str(tmp_path / "sft.yaml"), cwd=tmp_path)  # seeds, logs, warns
    assert fitted.returncode == 0, fitted.stderr[-3000:]
    assert "[rlhf-lit] exported SFT model to" in fitted.stdout
    _assert_same(before, _state())


def test_output_and_status_are_the_runs_own(tmp_path):
    # Each run's output is captured on its own: a second run does not see the first one's lines.
    first = run_main(
        "fit",
        "--model",
        "SFTModule",
        "--model.model",
        str(STORIES),
        "--data",
        "SFTDataModule",
        "--data.train_path",
        "no-such-file.txt",
        "--trainer.max_steps",
        "abc",
        cwd=tmp_path,
    )
    assert first.returncode == 2 and "trainer.max_steps" in error_line(first)
    second = run_main("--version", cwd=tmp_path)
    assert second.returncode == 0 and second.stdout.startswith("rlhf-lit ") and second.stderr == ""

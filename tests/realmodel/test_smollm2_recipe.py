"""The recipe configs/smollm2_hh/ runs as docs/recipes.md tells a user to run it: the reward model, DPO
and PPO (its reward model the run's RM export) on SmolLM2-135M-Instruct cut to 2 of its 30 layers
(tests/realmodel/conftest.py: its tokenizer, chat template and architecture;
the whole model answers in test_smollm2_basics.py and test_smollm2_compiled.py) and the shipped HH-RLHF
harmless-base file, each ``rlhf-lit fit --config ... --run_dir ...`` in a process of its own, with a tiny budget
on the command line. Every export keeps the model's ChatML template (the next stage and any
``rlhf-lit evaluate`` render prompts as training did)."""

from __future__ import annotations

import subprocess

import cli_forked
import pytest
from assets_paths import ROOT
from transformers import AutoTokenizer

pytestmark = [pytest.mark.slow, pytest.mark.realmodel]

RECIPE = ROOT / "configs" / "smollm2_hh"
DATA = ("--data.init_args.max_records", "20", "--data.init_args.max_prompt_length", "96")
TINY = {
    "reward_model": (
        "--trainer.max_steps",
        "1",
        "--trainer.val_check_interval",
        "1",
        "--trainer.limit_val_batches",
        "1",
        "--data.init_args.batch_size",
        "2",
        "--data.init_args.max_length",
        "160",
        *DATA,
    ),
    "dpo": (
        "--trainer.max_steps",
        "1",
        "--trainer.val_check_interval",
        "1",
        "--trainer.limit_val_batches",
        "1",
        "--data.init_args.batch_size",
        "2",
        "--data.init_args.max_length",
        "160",
        "--model.init_args.optimizer.warmup_steps",
        "0",
        *DATA,
    ),
    "ppo": (
        "--model.init_args.max_rollouts",
        "1",
        "--data.init_args.batch_size",
        "2",
        "--model.init_args.sampling.max_new_tokens",
        "8",
        "--model.init_args.ppo.epochs",
        "1",
        "--model.init_args.ppo.minibatch_size",
        "2",
        *DATA,
    ),
}
MODEL_OPTION = {
    "reward_model": "--model.init_args.model",
    "dpo": "--model.init_args.model",
    "ppo": "--model.init_args.sft_model",
}
QUIET = ("--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false")
NO_CHECKPOINT = {
    "reward_model": (
        "--trainer.callbacks.init_args.save_last",
        "false",
        "--trainer.callbacks.init_args.save_top_k",
        "0",
    ),
    "ppo": ("--trainer.callbacks.init_args.save_last", "false"),
}
"""The recipe's checkpoints switched off: on the whole model 3.1 GB each for the reward model and PPO
(weights and Adam states of 135M parameters; about a fifth of the test's time to write), about a
quarter of that on the 2-layer copy by parameter count (its 28M-parameter embedding is most of it); checkpointing and resume
are tested on the tiny models."""


def rlhf_lit(*args: str) -> subprocess.CompletedProcess:
    """``rlhf-lit <args>`` from the checkout (the configs' relative paths), in a process of its own
    (forked from this one: tests/cli_forked.py), in the suite's environment."""
    return cli_forked.run(*args, cwd=ROOT)


def test_the_recipe_trains_the_reward_model_dpo_and_ppo_on_the_real_model(smollm2_two_layers, tmp_path):
    smollm2_path = smollm2_two_layers
    run_dir = tmp_path / "run"
    template = AutoTokenizer.from_pretrained(smollm2_path).chat_template
    assert template and "<|im_start|>" in template
    for stage in ("reward_model", "dpo", "ppo"):
        result = rlhf_lit(
            "fit",
            "--config",
            str(RECIPE / f"{stage}.yaml"),
            "--run_dir",
            str(run_dir),
            MODEL_OPTION[stage],
            str(smollm2_path),
            *TINY[stage],
            *QUIET,
            *NO_CHECKPOINT.get(stage, ()),
        )
        assert result.returncode == 0, (stage, result.stderr[-3000:])
        export = run_dir / stage / "model"
        assert (export / "model.safetensors").exists(), (stage, sorted(p.name for p in export.glob("*")))
        # The exported tokenizer keeps the chat template the data was rendered with.
        assert AutoTokenizer.from_pretrained(export).chat_template == template, stage
        if stage != "ppo":
            assert "hh_render: auto, and the tokenizer" in result.stderr, stage
    # PPO read the RM the recipe's first stage exported (left unset in ppo.yaml, filled from --run_dir).
    assert (run_dir / "reward_model" / "model" / "config.json").exists()

"""A command line that feels native, driven through `rlhf-lit` in a subprocess.

Stages and data modules are listed by ``--help`` and taken by short name; the stages' own
optimizers are the only ones (no ``--optimizer`` / ``--lr_scheduler``); ``--trainer.max_steps`` is
refused for PPO; the progress bar counts rollouts (PPO) or steps out of the real total; a run
prints no warning it does not mean, and TensorBoard gets no placeholder ``hp_metric``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_helpers import (
    HH_RLHF,
    STORIES,
    TINYSTORIES,
    error_line,
    ppo_config,
    rlhf_lit,
    run_main,
    sft_config,
    write_yaml,
)

# ------------------------------------------------------------------------------------ discovery and options


def test_fit_help_lists_the_stages_and_data_modules_and_no_optimizer_options(tmp_path):
    result = run_main("fit", "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    for name in (
        "SFTModule",
        "RewardModelModule",
        "PPOModule",
        "SFTDataModule",
        "PreferenceDataModule",
        "PromptDataModule",
    ):
        assert re.search(rf"rlhf_lit\.(stages|data)\.{name}\b", result.stdout), name
    # The stages own their optimizers: LightningCLI's would crash PPO or replace SFT's AdamW.
    assert "--optimizer" not in result.stdout and "--lr_scheduler" not in result.stdout
    refused = run_main("fit", "--optimizer", "Adam", cwd=tmp_path)
    assert refused.returncode == 2
    assert error_line(refused) == "rlhf-lit: error: unknown option --optimizer"


def test_short_class_names_are_taken_for_model_and_data(tmp_path):
    result = run_main(
        "fit",
        "--model",
        "SFTModule",
        "--model.model",
        str(STORIES),
        "--data",
        "SFTDataModule",
        "--data.train_path",
        str(TINYSTORIES),
        "--print_config",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "class_path: rlhf_lit.stages.SFTModule" in result.stdout
    assert "class_path: rlhf_lit.data.SFTDataModule" in result.stdout
    helped = run_main("fit", "--model.help", "PPOModule", cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr[-3000:]
    assert "--model.max_rollouts" in helped.stdout


def test_max_steps_is_refused_for_ppo_before_any_rollout(tmp_path, stories_rm):
    write_yaml(tmp_path / "ppo.yaml", ppo_config(tmp_path, STORIES, stories_rm))
    result = run_main("fit", "--config", "ppo.yaml", "--trainer.max_steps", "2", cwd=tmp_path)
    assert result.returncode == 2
    line = error_line(result)
    assert "--trainer.max_steps 2 counts optimizer steps" in line and "--model.init_args.max_rollouts" in line
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "export").exists()


def test_a_policy_given_as_ppos_reward_model_is_refused_before_anything_is_built(tmp_path, stories_rm):
    # A causal LM has no trained score head: loaded as the reward model it gets a new random one, and PPO
    # would climb noise. `rlhf-lit evaluate` refuses it; so does `fit`, before any model is loaded.
    write_yaml(tmp_path / "ppo.yaml", ppo_config(tmp_path, STORIES, str(STORIES)))
    result = run_main("fit", "--config", "ppo.yaml", cwd=tmp_path)
    assert result.returncode == 2
    assert error_line(result) == (
        f"rlhf-lit: error: --model.init_args.reward_model {STORIES} is a LlamaForCausalLM, not a reward model "
        "(no trained score head); give the reward-model stage's export"
    )
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "export").exists()
    # Read only to start the critic (the reward is a function), it is not refused: a causal LM may start a critic.
    function_only = '[{"name": "truth", "function": "rlhf_lit.rewards.rules:mentions_ground_truth"}]'
    from rlhf_lit.cli import stage_refusal

    ppo = {"class_path": "rlhf_lit.stages.PPOModule", "init_args": {"reward_model": str(STORIES)}}
    assert "not a reward model" in stage_refusal(ppo, {})
    ppo["init_args"]["reward"] = {"sources": json.loads(function_only)}
    assert stage_refusal(ppo, {}) is None
    ppo["init_args"] = {"reward_model": stories_rm}
    assert stage_refusal(ppo, {}) is None


def test_the_cli_asks_the_stage_it_builds_what_it_refuses():
    # The CLI reads no stage's option names: the stage's refusal_before_build does (PPO's are in
    # stages/ppo/checks.py); a stage without refusals, or a class that is no stage, is not refused.
    from rlhf_lit.cli import stage_refusal

    ppo = {"class_path": "rlhf_lit.stages.PPOModule", "init_args": {"sampling": {"decode": "compiled"}}}
    assert "counts optimizer steps" in stage_refusal(ppo, {"max_steps": 2})
    assert stage_refusal(ppo, {"max_steps": -1}) is None
    assert stage_refusal(ppo, {"strategy": "fsdp2"}).startswith("sampling.decode compiled is not supported under fsdp")
    assert stage_refusal({"class_path": "rlhf_lit.stages.SFTModule", "init_args": {}}, {"max_steps": 2}) is None
    assert stage_refusal({"class_path": "collections.OrderedDict"}, {"max_steps": 2}) is None
    assert stage_refusal(None, {}) is None


# ------------------------------------------------------------------------------------ progress and noise

EXPECTED_STDERR = (
    "[rlhf-lit] ",  # rlhf-lit's own messages (record counts, normalisation)
    "Seed set to ",
    "GPU available: ",
    "TPU available: ",
    "`Trainer.fit` stopped: ",  # Lightning's facts
    "Loading weights:",
    "Writing model shards:",  # transformers' progress on large checkpoints
    "Sanity Checking",
    "Validation",  # Lightning's validation bars
    "rollout ",
    "step ",  # RunProgressBar
)
"""Starts of the stderr lines a run may print; anything else (a warning, a report) is noise."""


def unexpected_lines(stderr: str) -> list[str]:
    """Lines of stderr (progress bars split at carriage returns) that are not in EXPECTED_STDERR."""
    lines = [line.strip() for line in re.split(r"[\r\n]", stderr) if line.strip()]
    return [line for line in lines if not line.startswith(EXPECTED_STDERR)]


def bar_counts(stderr: str, unit: str) -> list[tuple[int, str]]:
    """Every ``<unit> k/total`` the training bar printed."""
    return [(int(n), total) for n, total in re.findall(rf"(?:^|[\r\n]){unit} (\d+)/(\S+) ", stderr)]


def as_a_user_runs_it(config: dict) -> dict:
    """The run with the CLI's defaults: its TensorBoard logger, its progress bar, the default log interval."""
    config["trainer"].pop("logger")
    config["trainer"].pop("enable_progress_bar")
    config["trainer"].pop("log_every_n_steps", None)
    return config


def assert_no_hp_metric(root: Path) -> None:
    events = list(root.rglob("events.out.tfevents.*"))
    assert events, "no TensorBoard event file written"
    assert all(b"hp_metric" not in path.read_bytes() for path in events)


@pytest.mark.slow
def test_ppo_bar_counts_rollouts_and_the_run_prints_no_warning(tmp_path, stories_rm):
    write_yaml(tmp_path / "ppo.yaml", as_a_user_runs_it(ppo_config(tmp_path, STORIES, stories_rm, max_rollouts=3)))
    result = rlhf_lit("fit", "--config", "ppo.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    counts = bar_counts(result.stderr, "rollout")
    assert counts and {total for _, total in counts} == {"3"}, counts  # max_rollouts, not the loader's 16 batches
    assert counts[-1][0] == 3
    assert "/-2" not in result.stderr and "Epoch" not in result.stderr
    # the rate (tqdm writes s/rollout below one rollout per second, as on a loaded machine) and the metrics
    assert re.search(r"rollout 3/3 100%.*(rollout/s|s/rollout), score=\S+, kl=\S+\]", result.stderr)
    assert unexpected_lines(result.stderr) == []
    assert_no_hp_metric(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["sft", "rm"])
def test_sft_and_rm_bars_count_steps_of_the_run_and_print_no_warning(stage, tmp_path):
    config = sft_config(tmp_path, TINYSTORIES, max_steps=3, data={"val_fraction": 0.2})
    if stage == "rm":  # stories260K is a causal LM: the reward head is created on purpose, without a report
        config["model"] = {
            "class_path": "rlhf_lit.stages.RewardModelModule",
            "init_args": {"model": str(STORIES), "optimizer": {"lr": 1.0e-3}, "export_dir": str(tmp_path / "export")},
        }
        config["data"] = {
            "class_path": "rlhf_lit.data.PreferenceDataModule",
            "init_args": {
                "train_path": str(HH_RLHF),
                "format": "hh_rlhf",
                "max_records": 48,
                "max_length": 96,
                "max_prompt_length": 64,
                "batch_size": 4,
                "val_fraction": 0.2,
            },
        }
    write_yaml(tmp_path / "run.yaml", as_a_user_runs_it(config))
    result = rlhf_lit("fit", "--config", "run.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    counts = bar_counts(result.stderr, "step")
    assert counts and {total for _, total in counts} == {"3"} and counts[-1][0] == 3, counts  # max_steps
    assert "/-2" not in result.stderr and "Epoch" not in result.stderr
    assert unexpected_lines(result.stderr) == []
    assert_no_hp_metric(tmp_path)

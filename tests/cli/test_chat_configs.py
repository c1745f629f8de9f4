"""The conversational configs that ship (configs/offline/chat/) run as a user runs them: SFT on
``messages`` records, the reward model on conversational pairs, DPO on implicit-prompt pairs and PPO
on conversational prompts, each ``rlhf-lit fit --config ...`` in a subprocess with the format left
to detection; PPO refuses a reward model that never saw the chat template; and the chat reward model, as
``evaluate``'s judge, reads the policy's prompts in its template and refuses them outside it."""

from __future__ import annotations

import json

import pytest
from assets_paths import STORIES260K_CHAT
from cli_helpers import ROOT, error_line, rlhf_lit_forked, run_main
from transformers import AutoTokenizer

CHAT = ROOT / "configs" / "offline" / "chat"
TINY = {
    "sft": (
        "--trainer.max_steps",
        "3",
        "--trainer.val_check_interval",
        "3",
        "--data.init_args.max_records",
        "40",
        "--model.init_args.optimizer.warmup_steps",
        "1",
    ),
    "reward_model": ("--trainer.max_steps", "3", "--data.init_args.max_records", "40"),
    "dpo": (
        "--trainer.max_steps",
        "2",
        "--data.init_args.max_records",
        "30",
        "--model.init_args.optimizer.warmup_steps",
        "1",
    ),
    "ppo": (
        "--model.init_args.max_rollouts",
        "2",
        "--model.init_args.sampling.max_new_tokens",
        "8",
        "--model.init_args.ppo.epochs",
        "1",
        "--data.init_args.batch_size",
        "8",
        "--model.init_args.ppo.minibatch_size",
        "4",
        "--data.init_args.max_records",
        "16",
    ),
}
QUIET = ("--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false")


def _fit(stage: str, run_dir, *extra: str):
    """``rlhf-lit fit --config configs/offline/chat/<stage>.yaml --run_dir <run_dir>`` with a tiny budget."""
    return rlhf_lit_forked(
        "fit",
        "--config",
        str(CHAT / f"{stage}.yaml"),
        "--run_dir",
        str(run_dir),
        *TINY[stage],
        *QUIET,
        *extra,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory):
    """SFT -> RM -> DPO -> PPO through the shipped chat configs into one run directory."""
    run_dir = tmp_path_factory.mktemp("chat") / "run"
    results = {}
    for stage in ("sft", "reward_model", "dpo", "ppo"):
        results[stage] = _fit(stage, run_dir)
        assert results[stage].returncode == 0, (stage, results[stage].stderr[-3000:])
    return run_dir, results


def test_the_chat_configs_train_every_stage_from_conversational_files(chat_run):
    run_dir, results = chat_run
    template = AutoTokenizer.from_pretrained(STORIES260K_CHAT).chat_template
    assert "{% generation %}" in template
    for stage in ("sft", "reward_model", "dpo", "ppo"):
        export = run_dir / stage / "model"
        assert (export / "model.safetensors").exists(), stage
        # Every export keeps the chat template: the next stage renders conversations as this one did.
        assert AutoTokenizer.from_pretrained(export).chat_template == template, stage
    detected = {stage: results[stage].stderr for stage in results}
    assert "sft.jsonl: format auto read as messages" in detected["sft"]
    assert "preferences.jsonl: format auto read as fields" in detected["reward_model"]
    assert "preferences_implicit.jsonl: format auto read as implicit_prompt" in detected["dpo"]
    assert "prompts.jsonl: format auto read as fields" in detected["ppo"]


def test_ppo_refuses_a_reward_model_trained_without_the_chat_template(chat_run, offline_chain, tmp_path):
    run_dir, _ = chat_run
    plain_rm = offline_chain.export("reward_model")  # the offline chain's RM: stories260K, no chat template
    result = run_main(
        "fit",
        "--config",
        str(CHAT / "ppo.yaml"),
        "--run_dir",
        str(tmp_path / "run"),
        "--model.init_args.sft_model",
        str(run_dir / "sft" / "model"),
        "--model.init_args.reward_model",
        str(plain_rm),
        *TINY["ppo"],
        *QUIET,
        cwd=ROOT,
    )
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-2] == (
        f"rlhf-lit: error: reward_model {plain_rm}: its tokenizer has no chat template, and the prompts are rendered "
        "with the policy's template: it would score conversations rendered otherwise than it was trained on. Train "
        "it from the SFT export (same tokenizer and template) on conversational pairs"
    )


def test_the_chat_reward_model_judges_the_chat_policy_in_its_template(chat_run, tmp_path):
    run_dir, _ = chat_run
    rm = run_dir / "reward_model" / "model"
    assert json.loads((rm / "rlhf_lit_export.json").read_text())["chat_rendered"] is True  # its prompts' rendering
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Tell me a story\n", encoding="utf-8")
    argv = ["--policy", str(run_dir / "ppo" / "model"), "--prompts", str(prompts), "--judge", str(rm)]
    out = tmp_path / "eval.json"
    judged = run_main("evaluate", *argv, "--max-new-tokens", "6", "--out", str(out), cwd=tmp_path)
    assert judged.returncode == 0, judged.stderr[-3000:]
    (sample,) = json.loads(out.read_text())["samples"]
    assert sample["prompt_text"].endswith("Assistant:") and isinstance(sample["judge"], float)
    # sampled outside the template, the prompt is not what the reward model was trained to read
    outside = run_main("evaluate", *argv, "--max-new-tokens", "6", "--chat-template", "never", cwd=tmp_path)
    assert outside.returncode != 0
    assert f"--judge {rm}: prompt 0 did not reach the policy rendered with the reward model's chat" in error_line(
        outside
    )

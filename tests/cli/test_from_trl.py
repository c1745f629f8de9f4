"""Coming from TRL (docs/from-trl.md): the option whose sign means the opposite is refused through
`rlhf-lit`, and the worked translation of TRL's PPO TL;DR example parses to the values the page gives."""

from __future__ import annotations

import yaml
from cli_helpers import ROOT, error_line, run_main

TRL_PPO = ROOT / "configs" / "from_trl" / "ppo_tldr.yaml"


def test_a_positive_missing_eos_penalty_stops_fit_with_one_line_before_any_model_loads(tmp_path):
    # A TRL user's `missing_eos_penalty 1.0`, ported as it is, would pay every cut response +1. The
    # models do not exist: the refusal must come first (not "sft_model not found").
    result = run_main(
        "fit",
        "--config",
        "configs/offline/ppo.yaml",
        "--run_dir",
        str(tmp_path / "run"),
        "--model.init_args.sft_model",
        str(tmp_path / "no_sft"),
        "--model.init_args.reward_model",
        str(tmp_path / "no_rm"),
        "--model.init_args.reward.missing_eos_penalty",
        "1.0",
        cwd=ROOT,
    )
    assert result.returncode == 1
    assert error_line(result) == (
        "rlhf-lit: error: reward.missing_eos_penalty=1.0 is positive: it REPLACES the score of a response without "
        "EOS (TRL's missing_eos_penalty is subtracted from it instead), so a positive value pays unfinished "
        "responses; give the score they get instead, e.g. -1.0, or null"
    )
    assert not (tmp_path / "run" / "ppo").exists()


def test_the_translated_trl_example_holds_the_values_the_page_gives():
    result = run_main("fit", "--config", str(TRL_PPO), "--print_config", cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    printed = yaml.safe_load(result.stdout)
    model, data = printed["model"]["init_args"], printed["data"]["init_args"]
    # missing_eos_penalty 1.0 (subtracted in TRL) becomes a replacing score below the RM's mean of 0.
    assert model["reward"]["missing_eos_penalty"] == -1.0
    # TRL's fixed kl_coef 0.05 with the k1 estimator, not rlhf-lit's adaptive default from 0.15.
    assert model["kl"]["kind"] == "fixed" and model["kl"]["init_coef"] == 0.05 and model["kl"]["estimator"] == "k1"
    # per_device_train_batch_size 16 x gradient_accumulation_steps 4 x num_mini_batches 1 prompts per process.
    ppo = model["ppo"]
    assert (ppo["minibatch_size"], ppo["grad_accum"], data["batch_size"]) == (16, 4, 64)
    assert data["batch_size"] // (ppo["minibatch_size"] * ppo["grad_accum"]) == 1  # num_mini_batches
    assert ppo["whiten_scope"] == "rank" and model["reward"]["whiten"] == "none"
    assert model["sampling"]["temperature"] == 0.7 and model["sampling"]["max_new_tokens"] == 53
    assert model["optimizer"]["schedule"] == "linear" and model["optimizer"]["lr"] == 3.0e-6
    assert model["max_rollouts"] * data["batch_size"] == 1_000_000  # total_episodes on one process
    page = (ROOT / "docs" / "from-trl.md").read_text(encoding="utf-8")
    assert "configs/from_trl/ppo_tldr.yaml" in page

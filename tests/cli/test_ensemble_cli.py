"""A reward-model ensemble through `rlhf-lit fit` with the shipped configs: train 4 members in one run,
export them as the run's reward model, and run PPO on it with the uncertainty-weighted aggregate; bad
aggregate settings are one `rlhf-lit: error:` line; `rlhf-lit evaluate` reads an ensemble's mean."""

from __future__ import annotations

import csv
import json

import torch
from assets_paths import HH_RLHF, STORIES260K, TINYSTORIES
from cli_helpers import ROOT, error_line, rlhf_lit_forked, run_main, tiny_ppo_overrides

RM_CONFIG = str(ROOT / "configs" / "offline" / "reward_model_ensemble.yaml")
PPO_CONFIG = str(ROOT / "configs" / "offline" / "ppo_ensemble.yaml")
RUN = "runs/ens"
TINY_RM = (
    "--model.init_args.model",
    str(STORIES260K),
    "--data.init_args.train_path",
    str(HH_RLHF),
    "--data.init_args.max_records",
    "32",
    "--data.init_args.val_fraction",
    "0.25",
    "--data.init_args.batch_size",
    "4",
    "--data.init_args.max_length",
    "64",
    "--data.init_args.max_prompt_length",
    "48",
    "--data.init_args.reference_path",
    str(TINYSTORIES),
    "--data.init_args.reference_max_records",
    "8",
    "--trainer.val_check_interval",
    "1.0",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.enable_model_summary",
    "false",
)
TINY_PPO = tiny_ppo_overrides(RUN)


def test_an_ensemble_trains_exports_and_drives_ppo_from_the_shipped_configs(tmp_path):
    rm = rlhf_lit_forked(
        "fit", "--config", RM_CONFIG, "--run_dir", RUN, *TINY_RM, "--trainer.max_steps", "2", cwd=tmp_path
    )
    assert rm.returncode == 0, rm.stderr[-3000:]
    (last,) = (tmp_path / RUN / "reward_model").rglob("last.ckpt")  # the checkpoint holds every member
    state = torch.load(last, map_location="cpu", weights_only=True)["state_dict"]
    assert {k.split(".")[2] for k in state if k.startswith("model.members.")} == {"0", "1", "2", "3"}
    assert state["reward_gain"].shape == (4,)
    export = tmp_path / RUN / "reward_model" / "model"  # the run's reward model, where PPO looks for it
    manifest = json.loads((export / "ensemble.json").read_text())
    assert [m["path"] for m in manifest["members"]] == [f"members/member_{m}" for m in range(4)]
    assert [m["seed"] for m in manifest["members"]] == [1234, 1235, 1236, 1237]  # seed_everything + m
    assert all((export / m["path"] / "config.json").is_file() for m in manifest["members"])
    assert len({m["normalization"]["gain"] for m in manifest["members"]}) == 4  # gain_bias, per member

    ppo = rlhf_lit_forked("fit", "--config", PPO_CONFIG, "--run_dir", RUN, *TINY_PPO, cwd=tmp_path)
    assert ppo.returncode == 0, ppo.stderr[-3000:]
    rows = [
        r
        for r in csv.DictReader(next((tmp_path / RUN / "ppo").rglob("metrics.csv")).open())
        if r["reward/reward_model"]
    ]
    assert len(rows) == 2  # one per rollout
    for row in rows:
        members = [float(row[f"reward/reward_model/member_{m}"]) for m in range(4)]
        std = float(row["reward/reward_model/std"])
        assert std > 0
        # uncertainty_weighted, lam 0.5 (the config): the rollout mean of (mean - 0.5 * std) per response
        assert abs(float(row["reward/reward_model"]) - (sum(members) / 4 - 0.5 * std)) < 1e-4


def test_bad_aggregate_settings_are_one_error_line(tmp_path, stories_rm):
    bad = '{"sources": [{"name": "reward_model", "aggregate": "median"}]}'
    result = run_main(
        "fit", "--config", PPO_CONFIG, "--run_dir", RUN, *TINY_PPO, "--model.init_args.reward", bad, cwd=tmp_path
    )
    assert result.returncode == 2
    assert error_line(result) == (
        "rlhf-lit: error: option --model.init_args.reward: sources[0].aggregate: expected one of 'mean', "
        "'uncertainty_weighted', 'worst_case', got median; did you mean 'mean'?"
    )
    negative = '{"sources": [{"name": "reward_model", "aggregate": "uncertainty_weighted", "lam": -1}]}'
    result = run_main(
        "fit",
        "--config",
        PPO_CONFIG,
        "--run_dir",
        RUN,
        *TINY_PPO,
        "--model.init_args.reward_model",
        stories_rm,
        "--model.init_args.reward",
        negative,
        cwd=tmp_path,
    )
    assert result.returncode == 1
    assert error_line(result) == "rlhf-lit: error: reward source 'reward_model': lam must be >= 0, got -1.0"
    single = '{"sources": [{"name": "reward_model", "aggregate": "worst_case", "lam": null}]}'
    result = run_main(
        "fit",
        "--config",
        PPO_CONFIG,
        "--run_dir",
        RUN,
        *TINY_PPO,
        "--model.init_args.reward_model",
        stories_rm,
        "--model.init_args.reward",
        single,
        cwd=tmp_path,
    )
    assert result.returncode == 1
    assert error_line(result) == (
        f"rlhf-lit: error: reward source 'reward_model': aggregate worst_case needs a reward-model ensemble; "
        f"model.reward_model {stories_rm} is a single reward model (no ensemble.json)"
    )


def test_evaluate_scores_with_the_members_mean(tmp_path, stories_rm):
    """`rlhf-lit evaluate --reward-model <ensemble>` reads the mean of the members' scores: members A and
    3A (A's head times 3) score 2A, on the same samples (same seed) as A alone."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from rlhf_lit.models.reward_ensemble import RewardEnsemble

    a = AutoModelForSequenceClassification.from_pretrained(stories_rm)
    b = AutoModelForSequenceClassification.from_pretrained(stories_rm)
    with torch.no_grad():
        b.score.weight.mul_(3.0)
    RewardEnsemble([a, b]).save_pretrained(tmp_path / "ens")
    AutoTokenizer.from_pretrained(stories_rm).save_pretrained(tmp_path / "ens")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Once upon a time\nThe dog ran\n")
    scores = {}
    for name, rm in (("single", stories_rm), ("ensemble", str(tmp_path / "ens"))):
        out = tmp_path / f"{name}.json"
        result = run_main(
            "evaluate",
            "--policy",
            str(STORIES260K),
            "--reward-model",
            rm,
            "--prompts",
            str(prompts),
            "--samples-per-prompt",
            "2",
            "--max-new-tokens",
            "6",
            "--seed",
            "2",
            "--out",
            str(out),
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        scores[name] = [s["rm"] for s in json.loads(out.read_text())["samples"]]
    assert len(scores["single"]) == 4
    for single, ensemble in zip(scores["single"], scores["ensemble"]):
        assert abs(ensemble - 2 * single) <= 1e-5 * max(1.0, abs(single))

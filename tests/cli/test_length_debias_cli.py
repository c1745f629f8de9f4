"""The length-debiased reward model through `rlhf-lit fit` with its shipped config
(configs/offline/reward_model_debiased.yaml): it trains both heads, exports an ordinary one-label
reward model, and PPO (configs/offline/ppo.yaml) reads that export unchanged."""

from __future__ import annotations

import csv
import json

import torch
from assets_paths import HH_RLHF, STORIES260K, TINYSTORIES
from cli_helpers import ROOT, error_line, run_main, tiny_ppo_overrides

RM_CONFIG = str(ROOT / "configs" / "offline" / "reward_model_debiased.yaml")
PPO_CONFIG = str(ROOT / "configs" / "offline" / "ppo.yaml")
RUN = "runs/odin"
TINY_RM = (
    "--model.init_args.model",
    str(STORIES260K),
    "--data.init_args.train_path",
    str(HH_RLHF),
    "--data.init_args.max_records",
    "40",
    "--data.init_args.val_fraction",
    "0.2",
    "--data.init_args.batch_size",
    "8",
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
    "--trainer.max_steps",
    "4",
)
TINY_PPO = tiny_ppo_overrides(RUN)


def test_the_shipped_config_trains_two_heads_exports_one_and_drives_ppo(tmp_path):
    rm = run_main("fit", "--config", RM_CONFIG, "--run_dir", RUN, *TINY_RM, cwd=tmp_path)
    assert rm.returncode == 0, rm.stderr[-3000:]
    (last,) = (tmp_path / RUN / "reward_model").rglob("last.ckpt")
    state = torch.load(last, map_location="cpu", weights_only=True)["state_dict"]
    assert state["model.score.weight"].shape[0] == 2  # quality and length heads while training
    export = tmp_path / RUN / "reward_model" / "model"  # where PPO looks for the run's reward model
    config = json.loads((export / "config.json").read_text())
    assert config["id2label"] == {"0": "LABEL_0"}  # one label: the quality head alone
    (metrics,) = (tmp_path / RUN / "reward_model").rglob("events.out.tfevents.*")
    assert metrics.stat().st_size > 0

    ppo = run_main("fit", "--config", PPO_CONFIG, "--run_dir", RUN, *TINY_PPO, cwd=tmp_path)
    assert ppo.returncode == 0, ppo.stderr[-3000:]
    rows = [
        r
        for r in csv.DictReader(next((tmp_path / RUN / "ppo").rglob("metrics.csv")).open())
        if r["reward/reward_model"]
    ]
    assert len(rows) == 2  # one per rollout, scored by the exported quality head


def test_odin_with_an_ensemble_is_one_error_line(tmp_path):
    result = run_main(
        "fit",
        "--config",
        RM_CONFIG,
        "--run_dir",
        RUN,
        *TINY_RM,
        "--model.init_args.ensemble.members",
        "2",
        cwd=tmp_path,
    )
    assert result.returncode == 1
    assert error_line(result) == (
        "rlhf-lit: error: length_debias.method odin is not supported with ensemble.members > 1; train one reward model"
    )

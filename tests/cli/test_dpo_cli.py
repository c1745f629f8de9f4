"""`rlhf-lit fit --config configs/offline/dpo.yaml` as a user runs it: exit 0 and a loadable export."""

from __future__ import annotations

import csv

import torch
from cli_helpers import ROOT, STORIES, run_main
from transformers import AutoModelForCausalLM, AutoTokenizer


def test_offline_dpo_config_trains_and_exports(tmp_path):
    # The shipped config, shortened, in its own run directory: stories260K stands in for the offline
    # SFT export the run would chain from.
    result = run_main(
        "fit",
        "--config",
        "configs/offline/dpo.yaml",
        "--run_dir",
        str(tmp_path / "run"),
        "--model.init_args.model",
        str(STORIES),
        "--model.init_args.optimizer.warmup_steps",
        "1",
        "--trainer.logger",
        "lightning.pytorch.loggers.CSVLogger",
        "--trainer.logger.init_args.save_dir",
        str(tmp_path / "run" / "logs"),
        "--trainer.max_steps",
        "3",
        "--trainer.val_check_interval",
        "3",
        "--trainer.log_every_n_steps",
        "1",
        "--data.init_args.max_records",
        "64",
        "--data.init_args.max_length",
        "96",
        "--data.init_args.max_prompt_length",
        "64",
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    export = tmp_path / "run" / "dpo" / "model"  # --run_dir: the export goes to <run_dir>/dpo/model
    model = AutoModelForCausalLM.from_pretrained(export)
    tokenizer = AutoTokenizer.from_pretrained(export)
    ids = torch.tensor([tokenizer("Once upon a time").input_ids])
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=ids).logits).all()
    rows = list(csv.DictReader(next((tmp_path / "run" / "logs").rglob("metrics.csv")).open()))
    logged = {k for row in rows for k, v in row.items() if v}
    for name in (
        "train/loss",
        "train/rewards_chosen",
        "train/rewards_rejected",
        "train/reward_accuracy",
        "train/reward_margin",
        "train/implicit_kl",
        "val/loss",
        "val/reward_accuracy",
    ):
        assert name in logged, sorted(logged)
    # The checkpoint written beside the logs leaves the frozen reference out.
    ckpt = next((tmp_path / "run").rglob("last.ckpt"))
    state = torch.load(ckpt, weights_only=True, map_location="cpu")["state_dict"]
    assert state and not any(k.startswith("ref_model.") for k in state)

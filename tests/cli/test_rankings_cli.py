"""Ranking records through `rlhf-lit fit`: a bad record or a column rankings cannot have is one
`rlhf-lit: error:` line naming the file, line and field (or the option), and DPO refuses ranking data
before training. Two cases (an error raised during fit, and the shipped config's run) run `rlhf-lit` as a process of
its own (forked from the test's process: tests/cli_forked.py), the rest its entry function."""

from __future__ import annotations

import json
from pathlib import Path

import cli_forked
from cli_helpers import ROOT, STORIES, error_line, run_main, sft_config, write_yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import AutoModelForSequenceClassification

GOOD = {
    "prompt": "Once upon a time",
    "responses": [" there was a cat.", " there was a dog.", " it rained."],
    "ranks": [0, 1, 1],
}


def _data(tmp_path: Path, *records: dict) -> Path:
    path = tmp_path / "rankings.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (GOOD, *records, GOOD)), encoding="utf-8")
    return path


def _config(tmp_path: Path, data: Path, stage: str = "RewardModelModule", **data_options) -> Path:
    """A reward-model (or DPO) run of a few steps on ranking records."""
    config = sft_config(tmp_path, data)
    config["model"] = {
        "class_path": f"rlhf_lit.stages.{stage}",
        "init_args": {"model": str(STORIES), "export_dir": str(tmp_path / "export")},
    }
    config["data"] = {
        "class_path": "rlhf_lit.data.PreferenceDataModule",
        "init_args": {
            "train_path": str(data),
            "format": "rankings",
            "max_length": 32,
            "max_prompt_length": 16,
            "batch_size": 2,
            **data_options,
        },
    }
    return write_yaml(tmp_path / "run.yaml", config)


def test_a_bad_response_is_named_by_file_line_and_field(tmp_path):
    data = _data(tmp_path, {"prompt": "Hi", "responses": [" a", " b", 3]})
    result = cli_forked.run("fit", "--config", str(_config(tmp_path, data)), cwd=tmp_path)
    assert result.returncode == 1
    assert error_line(result) == f"rlhf-lit: error: {data} line 2: field 'responses[2]' must be a string, got int"
    assert not (tmp_path / "export").exists()


def test_a_margin_column_with_rankings_is_refused(tmp_path):
    config = _config(tmp_path, _data(tmp_path), fields={"margin": "m"})
    result = run_main("fit", "--config", str(config), cwd=tmp_path)
    assert result.returncode == 1
    assert error_line(result) == (
        "rlhf-lit: error: fields.margin is set ('m') but format 'rankings' has no margin: a ranking only orders its "
        "responses (ties through fields.ranks); unset fields.margin"
    )


def test_duplicate_responses_and_bad_ranks_are_named(tmp_path):
    data = _data(tmp_path, {"prompt": "Hi", "responses": [" a", " b", " a"]})
    result = run_main("fit", "--config", str(_config(tmp_path, data)), cwd=tmp_path)
    assert result.returncode == 1
    assert (
        error_line(result)
        == f"rlhf-lit: error: {data} line 2: field 'responses[2]' repeats 'responses[0]' (responses must differ)"
    )
    data = _data(tmp_path, {"prompt": "Hi", "responses": [" a", " b"], "ranks": [0, 1, 2]})
    result = run_main("fit", "--config", str(_config(tmp_path, data, fields={"ranks": "ranks"})), cwd=tmp_path)
    assert error_line(result) == (
        f"rlhf-lit: error: {data} line 2: field 'ranks' must be a list of 2 ints (one per response), got 3 values"
    )


def test_dpo_refuses_ranking_data_before_training(tmp_path):
    result = run_main("fit", "--config", str(_config(tmp_path, _data(tmp_path), stage="DPOModule")), cwd=tmp_path)
    assert result.returncode == 1
    assert error_line(result) == (
        "rlhf-lit: error: DPO trains on preference pairs, but the data module reads format 'rankings' (K ranked "
        "responses per prompt): give DPO pair data (format fields or hh_rlhf, e.g. the best and the worst response of "
        "each ranking as chosen and rejected), or train a reward model on the rankings (RewardModelModule)"
    )
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "export").exists()


def test_offline_rankings_config_trains_and_exports(tmp_path):
    """The shipped config, shortened, in its own run directory (stories260K stands in for the offline SFT
    export): `rlhf-lit fit` trains on the shipped rankings, logs the ranking metrics and exports a loadable RM."""
    run = tmp_path / "run"
    result = cli_forked.run(  # a process of its own (forked: tests/cli_forked.py)
        "fit",
        "--config",
        str(ROOT / "configs/offline/reward_model_rankings.yaml"),
        "--run_dir",
        str(run),
        "--model.init_args.model",
        str(STORIES),
        "--trainer.max_epochs",
        "1",
        "--trainer.max_steps",
        "3",
        "--trainer.val_check_interval",
        "3",
        "--trainer.log_every_n_steps",
        "1",
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    model = AutoModelForSequenceClassification.from_pretrained(run / "reward_model" / "model")
    assert model.config.num_labels == 1
    # normalised on the validation rankings: every ranked response, which the record says
    assert model.config.rlhf_lit_reward_normalization["reference"] == (
        "PreferenceDataModule.val_dataloader() every ranked response"
    )
    events = EventAccumulator(str(next((run / "reward_model").glob("version_*")))).Reload()
    assert {"val/accuracy", "val/ranking_exact", "val/kendall_tau", "train/loss"} <= set(events.Tags()["scalars"])

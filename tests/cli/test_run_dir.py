"""``--run_dir``: one directory per experiment, the stages chained through it (rlhf_lit.cli.run_dir).

The chain is driven as the README shows it, ``rlhf-lit`` in subprocesses with command-line options
only (no YAML), on stories260K with a few steps per stage: the session's shared chain
(tests/offline_chain.py). Later runs into it (a stage again, a resume) use a private copy and the
CLI's entry function in this process. The rules for settings that contradict
the run directory are checked on the parsed config directly (no process needed), the errors a
user sees through ``rlhf-lit``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from cli_helpers import ROOT, STORIES, error_line, run_main
from jsonargparse import Namespace
from offline_chain import PPO, SFT  # the chain's stage arguments (tests/offline_chain.py)

from rlhf_lit.cli import DEFAULT_LOGGER
from rlhf_lit.cli.run_dir import RunDirError, apply_run_dir

STAGES = {"sft": "SFT model", "reward_model": "reward model", "ppo": "PPO policy"}
"""Each stage's folder and the ``what`` its export marker records."""


def _ok(result) -> None:
    """Assert a run succeeded, showing the end of its stderr otherwise."""
    assert result.returncode == 0, result.stderr[-4000:]


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and modification time: what "untouched" compares."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def _config(cwd: Path, stage: str) -> dict:
    """The config.yaml a stage of the ``runs/exp1`` chain saved beside its logs."""
    return yaml.safe_load((cwd / "runs/exp1" / stage / "version_0" / "config.yaml").read_text())


@pytest.fixture
def chain(offline_chain) -> tuple[Path, dict]:
    """SFT -> RM -> PPO in an empty working directory, all with ``--run_dir runs/exp1`` and nothing else
    naming a path of the run: the session's shared chain (tests/offline_chain.py), read only."""
    for result in offline_chain.results.values():
        _ok(result)
    return offline_chain.cwd, offline_chain.results


@pytest.fixture
def private_chain(offline_chain, tmp_path) -> tuple[Path, dict]:
    """A copy of the shared chain in this test's own folder, for a test that writes into it."""
    copy = offline_chain.copy_to(tmp_path / "work")
    return copy.cwd, copy.results


def test_the_chain_writes_logs_checkpoints_config_and_exports_under_the_run_dir_and_nothing_else(chain):
    cwd, _ = chain
    assert sorted(os.listdir(cwd)) == ["runs"]  # no logs/, lightning_logs/, checkpoints/ beside it
    run = cwd / "runs/exp1"
    assert sorted(os.listdir(run)) == ["ppo", "reward_model", "sft"]
    for stage, what in STAGES.items():
        assert sorted(os.listdir(run / stage)) == ["model", "version_0"], stage
        version = run / stage / "version_0"
        assert (version / "config.yaml").is_file() and (version / "hparams.yaml").is_file()
        assert list(version.glob("events.out.tfevents.*")), stage  # TensorBoard
        assert list((version / "checkpoints").glob("*.ckpt")), stage
        marker = json.loads((run / stage / "model" / "rlhf_lit_export.json").read_text())
        assert marker["what"] == what
        assert _config(cwd, stage)["model"]["init_args"]["export_dir"] == f"runs/exp1/{stage}/model"
        assert _config(cwd, stage)["run_dir"] == "runs/exp1"


def test_each_stage_read_the_previous_stages_export_without_it_being_named(chain):
    cwd, results = chain
    assert _config(cwd, "reward_model")["model"]["init_args"]["model"] == "runs/exp1/sft/model"
    ppo = _config(cwd, "ppo")["model"]["init_args"]
    assert (ppo["sft_model"], ppo["reward_model"]) == ("runs/exp1/sft/model", "runs/exp1/reward_model/model")
    assert (
        "[rlhf-lit] model: runs/exp1/sft/model (the sft export of --run_dir runs/exp1)"
        in results["reward_model"].stderr
    )
    assert (
        "[rlhf-lit] reward_model: runs/exp1/reward_model/model (the reward_model export of --run_dir runs/exp1)"
        in results["ppo"].stderr
    )


def test_a_stage_run_again_is_refused_and_a_second_run_dir_is_a_second_experiment(private_chain):
    cwd, _ = private_chain
    before = _snapshot(cwd / "runs/exp1")
    again = run_main(*SFT, "--run_dir", "runs/exp1", cwd=cwd)
    assert again.returncode == 1
    assert error_line(again).startswith(
        "rlhf-lit: error: --run_dir runs/exp1: the SFT stage has run there already (its export "
        "runs/exp1/sft/model exists); for a new experiment give another --run_dir"
    )
    _ok(run_main(*SFT, "--run_dir", "runs/exp2", "--model.optimizer.lr", "1e-3", cwd=cwd))
    assert (cwd / "runs/exp2/sft/model/rlhf_lit_export.json").is_file()
    assert (cwd / "runs/exp2/sft/version_0/config.yaml").is_file()
    assert _snapshot(cwd / "runs/exp1") == before  # the first experiment untouched
    assert sorted(os.listdir(cwd)) == ["runs"]


def test_resuming_from_a_checkpoint_in_the_run_dir_logs_into_the_same_version(private_chain):
    cwd, _ = private_chain
    version = cwd / "runs/exp1/ppo/version_0"
    events_before = set(version.glob("events.out.tfevents.*"))
    (checkpoint,) = (version / "checkpoints").glob("*.ckpt")
    resumed = run_main(
        *PPO,
        "--run_dir",
        "runs/exp1",
        "--ckpt_path",
        str(checkpoint.relative_to(cwd)),
        "--model.max_rollouts",
        "3",
        "--model.export_existing",
        "replace",
        cwd=cwd,
    )
    _ok(resumed)
    assert sorted(os.listdir(cwd / "runs/exp1/ppo")) == ["model", "version_0"]  # no version_1
    assert set(version.glob("events.out.tfevents.*")) > events_before  # this run's events beside the first's
    assert "max_rollouts: 3" in (version / "config.yaml").read_text()  # the resumed run's config


# ------------------------------------------------------------------------ errors a user sees


def test_a_missing_earlier_stage_is_one_error_naming_the_command_to_run(tmp_path):
    # configs/offline/reward_model.yaml as it is, only --run_dir added: the RM reads the run's SFT export.
    result = run_main(
        "fit", "--config", str(ROOT / "configs/offline/reward_model.yaml"), "--run_dir", "runs/exp1", cwd=tmp_path
    )
    assert result.returncode == 1
    assert error_line(result) == (
        "rlhf-lit: error: runs/exp1/sft/model not found: run the SFT stage with --run_dir runs/exp1 first "
        "(model.init_args.model defaults to it; set --model.init_args.model to use another model)"
    )
    assert os.listdir(tmp_path) == []  # refused before anything was written


def test_ppo_without_the_runs_reward_model_names_the_reward_model_stage(tmp_path):
    shutil.copytree(STORIES, tmp_path / "runs/exp1/sft/model")  # an SFT export, no RM yet
    result = run_main(*PPO, "--run_dir", "runs/exp1", cwd=tmp_path)
    assert result.returncode == 1
    assert error_line(result).startswith(
        "rlhf-lit: error: runs/exp1/reward_model/model not found: run the reward model stage with --run_dir runs/exp1 first"
    )


def test_an_export_dir_elsewhere_contradicts_the_run_dir(tmp_path):
    result = run_main(*SFT, "--run_dir", "runs/exp1", "--model.export_dir", "exports/sft", cwd=tmp_path)
    assert result.returncode == 1
    assert error_line(result) == (
        "rlhf-lit: error: --run_dir runs/exp1 puts the SFT export at runs/exp1/sft/model (where later stages "
        "look for it), but model.init_args.export_dir is exports/sft; drop export_dir (or "
        "--model.init_args.export_dir null), or drop --run_dir"
    )
    assert os.listdir(tmp_path) == []


def test_a_logger_writing_elsewhere_contradicts_the_run_dir(tmp_path):
    result = run_main(
        *SFT,
        "--run_dir",
        "runs/exp1",
        "--trainer.logger",
        "lightning.pytorch.loggers.CSVLogger",
        "--trainer.logger.save_dir",
        "csv",
        cwd=tmp_path,
    )
    assert result.returncode == 1
    assert error_line(result).startswith(
        "rlhf-lit: error: --run_dir runs/exp1: trainer.logger (CSVLogger) writes to save_dir csv, outside the run directory"
    )


def test_fit_help_documents_run_dir():
    result = run_main("fit", "--help", cwd=ROOT)
    _ok(result)
    assert "--run_dir" in result.stdout and "RUN_DIR/<stage>/" in result.stdout


# ------------------------------------------------------------ the rules, on a parsed config


def _parsed(run_dir: str | None = "runs/x", stage: str = "rlhf_lit.stages.SFTModule", **init_args) -> Namespace:
    """A config as LightningCLI has it before instantiation, with the CLI's default logger."""
    logger = Namespace(
        class_path=DEFAULT_LOGGER["class_path"], init_args=Namespace(**DEFAULT_LOGGER["init_args"], version=None)
    )
    model = Namespace(
        class_path=stage, init_args=Namespace(**{"export_dir": None, "export_existing": "refuse", **init_args})
    )
    trainer = Namespace(logger=logger, default_root_dir="logs", callbacks=None)
    return Namespace(run_dir=run_dir, ckpt_path=None, trainer=trainer, model=model)


DEFAULTS = {"logger": DEFAULT_LOGGER, "default_root_dir": "logs"}


def test_unset_outputs_are_filled_and_explicit_ones_under_the_run_dir_are_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = _parsed()
    apply_run_dir(cfg, DEFAULTS, "fit")
    assert cfg.trainer.logger.init_args.save_dir == "runs/x" and cfg.trainer.logger.init_args.name == "sft"
    assert cfg.trainer.default_root_dir == os.path.join("runs/x", "sft")
    assert cfg.model.init_args.export_dir == os.path.join("runs/x", "sft", "model")

    cfg = _parsed(export_dir=str(tmp_path / "runs/x/sft/model"))  # the same place, spelled absolute
    cfg.trainer.logger = Namespace(
        class_path="lightning.pytorch.loggers.CSVLogger", init_args=Namespace(save_dir="runs/x/csv", name="mine")
    )
    apply_run_dir(cfg, DEFAULTS, "fit")
    assert cfg.trainer.logger.init_args.save_dir == "runs/x/csv" and cfg.trainer.logger.init_args.name == "mine"
    assert cfg.model.init_args.export_dir == str(tmp_path / "runs/x/sft/model")


def test_without_run_dir_nothing_changes():
    cfg = _parsed(run_dir=None)
    before = cfg.clone()
    apply_run_dir(cfg, DEFAULTS, "fit")
    assert cfg == before


def test_a_checkpoint_dirpath_or_root_dir_outside_the_run_dir_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = _parsed()
    cfg.trainer.callbacks = [Namespace(class_path="rlhf_lit.callbacks.Checkpoint", init_args=Namespace(dirpath="ckpt"))]
    with pytest.raises(RunDirError, match="Checkpoint writes checkpoints to dirpath ckpt, outside the run directory"):
        apply_run_dir(cfg, DEFAULTS, "fit")
    cfg = _parsed()
    cfg.trainer.default_root_dir = "elsewhere"
    with pytest.raises(RunDirError, match="trainer.default_root_dir elsewhere is outside the run directory"):
        apply_run_dir(cfg, DEFAULTS, "fit")


def test_an_input_given_explicitly_is_used_and_a_function_only_reward_needs_no_rm(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(STORIES, tmp_path / "runs/x/sft/model")
    sources = [Namespace(name="len", weight=1.0, function="rlhf_lit.rewards.shaping:length_target", kwargs={})]
    cfg = _parsed(
        stage="rlhf_lit.stages.PPOModule", sft_model=None, reward_model=None, reward=Namespace(sources=sources)
    )
    apply_run_dir(cfg, DEFAULTS, "fit")
    assert cfg.model.init_args.sft_model == os.path.join("runs/x", "sft", "model")
    assert cfg.model.init_args.reward_model is None  # no source is the reward model: not looked for

    cfg = _parsed(stage="rlhf_lit.stages.RewardModelModule", model=str(STORIES))
    apply_run_dir(cfg, DEFAULTS, "fit")
    assert cfg.model.init_args.model == str(STORIES)


def test_a_stage_without_a_run_layout_is_refused():
    # Lightning's own base class, not a demo one: importing lightning.pytorch.demos registers its
    # BoringDataModule, which the --data errors of later tests in this process would then list.
    cfg = _parsed(stage="lightning.pytorch.LightningModule")
    with pytest.raises(RunDirError, match="LightningModule declares no run_layout"):
        apply_run_dir(cfg, DEFAULTS, "fit")


def test_a_missing_export_of_a_run_dir_config_is_named_by_the_cli_not_by_sources(tmp_path, monkeypatch):
    # sources.py cannot tell where a stage exports in a run directory (it sits below the stages):
    # alone it names only configs with an export_dir; the CLI adds the run_dir configs.
    from rlhf_lit.cli.run_dir import with_run_dir_hint
    from rlhf_lit.sources import MissingSource, model_source, producing_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "sft.yaml").write_text(
        "run_dir: runs/exp\nmodel:\n  class_path: rlhf_lit.stages.SFTModule\n", encoding="utf-8"
    )
    with pytest.raises(MissingSource) as missing:
        model_source("runs/exp/sft/model", "sft_model")
    assert str(missing.value) == "sft_model not found: runs/exp/sft/model (no such directory)"
    assert producing_config("runs/exp/sft/model") is None
    assert str(with_run_dir_hint(missing.value)) == (
        "sft_model not found: runs/exp/sft/model (no such directory; it is the export of configs/sft.yaml: "
        "run `rlhf-lit fit --config configs/sft.yaml` first)"
    )
    other = ValueError("something else")
    assert with_run_dir_hint(other) is other

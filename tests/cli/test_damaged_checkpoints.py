"""Damaged checkpoints and a full disk, met through `rlhf-lit` with one message (exports and ensembles:
test_damaged_files.py).

A checkpoint given with ``--ckpt_path`` is damaged in each way it can be: the run stops before any model is
loaded with one ``rlhf-lit: error:`` line naming the file. A damaged ``last.ckpt`` names the newest intact
checkpoint beside it and the command resuming from it, and that command resumes. A disk that fills up
while a checkpoint or the export is written keeps every earlier checkpoint and the export intact
(tests/cli/test_run_lock.py: two runs on one run directory).
"""

from __future__ import annotations

import errno
import shlex
import shutil
from pathlib import Path

import pytest
import torch
from cli_helpers import STORIES, TINYSTORIES, error_line, run_main, sft_config, write_yaml
from damage import damage_file

from rlhf_lit.integrity import check_checkpoint

# ------------------------------------------------------------------------------------ checkpoints


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory) -> Path:
    """An SFT run of 4 steps with a checkpoint every 2: ``ckpt/`` holds step 2, step 4 and ``last.ckpt``.

    Its paths are relative (``ckpt``, ``export``, ``logs``), so a copy of the folder is a run of its own."""
    root = tmp_path_factory.mktemp("sft-run")
    config = sft_config(Path("."), TINYSTORIES, max_steps=4)
    config["trainer"]["callbacks"][0]["init_args"]["save_top_k"] = -1  # keep step 2 beside step 4
    write_yaml(root / "sft.yaml", config)
    result = run_main("fit", "--config", "sft.yaml", cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    return root


def _run_copy(sft_run: Path, tmp_path: Path) -> Path:
    """A private copy of the SFT run (modification times kept: they order the checkpoints)."""
    return Path(shutil.copytree(sft_run, tmp_path / "run", copy_function=shutil.copy2))


def resumed_fit(run: Path, ckpt_path: str, max_steps: int):
    """``rlhf-lit fit`` of a copied SFT run from ``--ckpt_path`` on to ``max_steps``, replacing its export."""
    return run_main(
        "fit",
        "--config",
        "sft.yaml",
        "--ckpt_path",
        ckpt_path,
        "--trainer.max_steps",
        str(max_steps),
        "--model.init_args.export_existing",
        "replace",
        cwd=run,
    )


@pytest.mark.parametrize("damage", ["truncated", "empty", "not_the_format", "missing_member", "missing"])
def test_a_damaged_checkpoint_is_named_before_any_model_is_loaded(sft_run, tmp_path, damage):
    run = _run_copy(sft_run, tmp_path)
    (step2,) = (run / "ckpt").glob("*step=2.ckpt")
    damage_file(step2, damage)
    result = run_main("fit", "--config", "sft.yaml", "--ckpt_path", f"ckpt/{step2.name}", cwd=run)
    assert result.returncode == 1
    problem = {
        "truncated": "cut short (",
        "empty": "the file is empty (0 bytes)",
        "not_the_format": "not a PyTorch checkpoint (it does not start as a zip archive)",
        "missing_member": "incomplete checkpoint: 1 tensor record(s) missing",
        "missing": "no such file",
    }[damage]
    assert error_line(result).startswith(f"rlhf-lit: error: --ckpt_path ckpt/{step2.name}: {problem}")
    assert "the newest intact" not in result.stderr  # only last.ckpt points elsewhere


def test_a_damaged_last_checkpoint_names_the_newest_intact_one_and_its_command_resumes(sft_run, tmp_path):
    run = _run_copy(sft_run, tmp_path)
    (step4,) = (run / "ckpt").glob("*step=4.ckpt")
    damage_file(run / "ckpt" / "last.ckpt", "truncated")
    given = (
        "fit",
        "--config",
        "sft.yaml",
        "--ckpt_path",
        "ckpt/last.ckpt",
        "--trainer.max_steps",
        "5",
        "--model.init_args.export_existing",
        "replace",
    )
    result = run_main(*given, cwd=run)
    assert result.returncode == 1
    line = error_line(result)
    assert line.startswith("rlhf-lit: error: --ckpt_path ckpt/last.ckpt: cut short (")
    assert f"the newest intact checkpoint beside it is ckpt/{step4.name}: resume from it with `" in line
    command = shlex.split(line.split("`")[1])
    assert command[:2] == ["rlhf-lit", "fit"] and command[-2:] == ["--ckpt_path", f"ckpt/{step4.name}"]
    resumed = run_main(*command[1:], cwd=run)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert torch.load(run / "ckpt" / "last.ckpt", map_location="cpu", weights_only=True)["global_step"] == 5


def test_a_damaged_last_checkpoint_alone_says_to_start_again(sft_run, tmp_path):
    run = _run_copy(sft_run, tmp_path)
    for ckpt in (run / "ckpt").glob("*.ckpt"):
        damage_file(ckpt, "empty")
    result = run_main("fit", "--config", "sft.yaml", "--ckpt_path", "ckpt/last.ckpt", cwd=run)
    assert result.returncode == 1
    assert error_line(result) == (
        "rlhf-lit: error: --ckpt_path ckpt/last.ckpt: the file is empty (0 bytes); no intact "
        "checkpoint beside it to resume from: start the run again without --ckpt_path"
    )


def test_ckpt_path_last_is_checked_where_lightning_resolves_and_loads_it(sft_run, tmp_path):
    # `--ckpt_path last` names no file until Lightning resolves it inside fit: a damaged last.ckpt is
    # named there, with what to resume from, not met with torch's zip-reader traceback.
    run = _run_copy(sft_run, tmp_path)
    (step4,) = (run / "ckpt").glob("*step=4.ckpt")
    damage_file(run / "ckpt" / "last.ckpt", "truncated")
    before = {p.name: p.read_bytes() for p in (run / "ckpt").glob("*.ckpt")}
    result = resumed_fit(run, "last", 5)
    assert result.returncode == 1
    line = error_line(result)
    assert line.startswith("rlhf-lit: error: --ckpt_path last (") and "last.ckpt): cut short (" in line, line
    assert f"{step4.name}: resume from it with `" in line
    command = shlex.split(line.split("`")[1])
    assert command[:2] == ["rlhf-lit", "fit"] and command[-2] == "--ckpt_path" and command[-1].endswith(step4.name)
    assert {p.name: p.read_bytes() for p in (run / "ckpt").glob("*.ckpt")} == before  # nothing written


# ------------------------------------------------------------------------------------ a full disk


def test_a_disk_full_during_a_checkpoint_keeps_the_earlier_checkpoints_and_the_export(sft_run, tmp_path, monkeypatch):
    # The disk fills up half way through the next checkpoint: the write fails as a full disk fails it.
    import lightning.fabric.plugins.io.torch_io as torch_io

    run = _run_copy(sft_run, tmp_path)
    before = {p.name: p.read_bytes() for p in (run / "ckpt").glob("*.ckpt")}
    export = (run / "export" / "model.safetensors").read_bytes()

    def full_disk(checkpoint, path) -> None:
        with open(path, "wb") as f:
            f.write(b"PK\x03\x04" + b"\0" * 100)  # what fitted before the disk was full
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(torch_io, "_atomic_save", full_disk)  # what TorchCheckpointIO writes with
    result = resumed_fit(run, "ckpt/last.ckpt", 6)
    assert result.returncode == 1
    assert "No space left on device" in error_line(result)
    assert {p.name: p.read_bytes() for p in (run / "ckpt").glob("*.ckpt")} == before  # no final name was touched
    for ckpt in (run / "ckpt").glob("*.ckpt"):
        check_checkpoint(ckpt)
        assert torch.load(ckpt, map_location="cpu", weights_only=True)["global_step"] in (2, 4)
    assert (run / "export" / "model.safetensors").read_bytes() == export
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(run / "export")  # the export still loads


def test_a_cut_short_output_of_a_command_is_kept_and_named(tmp_path):
    (tmp_path / "prompts.txt").write_text("Once upon a time\n")
    out = tmp_path / "out.json"
    out.write_text('{"written_by": "rlhf-lit evaluate", "metrics": {"judge_mean"')  # a copy cut short
    result = run_main(
        "evaluate",
        "--policy",
        str(STORIES),
        "--prompts",
        "prompts.txt",
        "--out",
        "out.json",
        "--overwrite",
        cwd=tmp_path,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--out out.json: cut short (line 1, column " in result.stderr
    assert "so it cannot be told as rlhf-lit's output; it is not replaced even with --overwrite" in result.stderr
    assert out.read_text().endswith('"judge_mean"')


def test_a_disk_full_during_the_export_keeps_the_earlier_export_and_the_checkpoints(sft_run, tmp_path, monkeypatch):
    # The disk fills up while the new export's weights are written: the earlier export stays in place.
    from transformers import AutoModelForCausalLM, PreTrainedModel

    run = _run_copy(sft_run, tmp_path)
    export = (run / "export" / "model.safetensors").read_bytes()

    def full_disk(model, directory, **kwargs) -> None:
        (Path(directory) / "model.safetensors").write_bytes(b"\0" * 64)  # what fitted
        raise OSError(errno.ENOSPC, "No space left on device", str(Path(directory) / "model.safetensors"))

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full_disk)
    result = resumed_fit(run, "ckpt/last.ckpt", 5)
    assert result.returncode == 1
    assert "No space left on device" in error_line(result)
    assert (run / "export" / "model.safetensors").read_bytes() == export
    assert not [p.name for p in run.iterdir() if p.name.startswith(".")]  # the half-written export is gone
    monkeypatch.undo()
    AutoModelForCausalLM.from_pretrained(run / "export")
    for ckpt in (run / "ckpt").glob("*.ckpt"):  # last.ckpt now holds step 5, written before the export
        check_checkpoint(ckpt)

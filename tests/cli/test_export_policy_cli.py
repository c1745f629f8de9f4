"""``rlhf-lit export-policy``: the policy of a checkpoint (or of each ``rollout=<n>.ckpt`` of a folder) as an
export, in this process (``cli_in_process.run_main``), on the tiny offline model."""

from __future__ import annotations

import pytest
import torch
from cli_helpers import STORIES, error_line, run_main
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlhf_lit.artifacts import EXPORT_MARKER


def _checkpoint(path, shift: float) -> dict[str, torch.Tensor]:
    """A checkpoint as ``PPOModule`` holds one: the policy under ``policy.`` (the base model's weights moved by
    ``shift``) beside another module's entries; returns the policy's weights."""
    policy = {k: v + shift for k, v in AutoModelForCausalLM.from_pretrained(STORIES).state_dict().items()}
    state = {**{f"policy.{k}": v for k, v in policy.items()}, "critic.v_head.weight": torch.zeros(1, 4)}
    torch.save({"state_dict": state, "epoch": 0}, path)
    return policy


def _same(folder, weights: dict[str, torch.Tensor]) -> bool:
    loaded = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    return loaded.keys() == weights.keys() and all(torch.equal(loaded[k], weights[k]) for k in weights)


def test_a_checkpoint_and_a_folder_of_rollout_checkpoints_become_exports(tmp_path):
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    third, seventh = _checkpoint(ckpts / "rollout=3.ckpt", 0.01), _checkpoint(ckpts / "rollout=7.ckpt", 0.02)
    (ckpts / "last.ckpt").write_text("not a rollout checkpoint: not exported")

    done = run_main(
        "export-policy",
        "--checkpoint",
        str(ckpts / "rollout=3.ckpt"),
        "--base-model",
        str(STORIES),
        "--out",
        "one",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "one" / EXPORT_MARKER).is_file() and _same(tmp_path / "one", third)
    assert AutoTokenizer.from_pretrained(tmp_path / "one")("Once upon a time").input_ids  # its tokenizer beside it

    done = run_main(
        "export-policy", "--checkpoint", "checkpoints", "--base-model", str(STORIES), "--out", "along", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "along").iterdir()) == ["rollout_3", "rollout_7"]
    assert _same(tmp_path / "along" / "rollout_3", third) and _same(tmp_path / "along" / "rollout_7", seventh)

    # An earlier export is replaced only when asked; a folder rlhf-lit did not write never is.
    again = run_main(
        "export-policy", "--checkpoint", "checkpoints", "--base-model", str(STORIES), "--out", "along", cwd=tmp_path
    )
    assert again.returncode == 2 and "holds an earlier rlhf-lit export; pass --overwrite" in error_line(again)
    again = run_main(
        "export-policy",
        "--checkpoint",
        "checkpoints/rollout=7.ckpt",
        "--base-model",
        str(STORIES),
        "--out",
        "along/rollout_3",
        "--overwrite",
        cwd=tmp_path,
    )
    assert again.returncode == 0, again.stderr
    assert _same(tmp_path / "along" / "rollout_3", seventh)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    refused = run_main(
        "export-policy",
        "--checkpoint",
        "checkpoints/rollout=3.ckpt",
        "--base-model",
        str(STORIES),
        "--out",
        "mine",
        "--overwrite",
        cwd=tmp_path,
    )
    assert refused.returncode == 2 and "not written by rlhf-lit; it is never replaced" in error_line(refused)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("case", ["prefix", "misfit", "missing", "empty folder"])
def test_refusals_are_one_line_and_write_nothing(tmp_path, case):
    _checkpoint(tmp_path / "rollout=1.ckpt", 0.0)
    (tmp_path / "empty").mkdir()
    checkpoint, prefix = {
        "prefix": ("rollout=1.ckpt", "model."),
        "misfit": ("rollout=1.ckpt", ""),  # every entry: the policy's names under policy., and the critic's
        "missing": ("nowhere.ckpt", "policy."),
        "empty folder": ("empty", "policy."),
    }[case]
    done = run_main(
        "export-policy",
        "--checkpoint",
        checkpoint,
        "--base-model",
        str(STORIES),
        "--out",
        "out",
        "--prefix",
        prefix,
        cwd=tmp_path,
    )
    first = error_line(done)
    expected = {
        "prefix": (1, "rlhf-lit: error: --checkpoint rollout=1.ckpt: no weights under 'model.'"),
        "misfit": (
            1,
            "rlhf-lit: error: --checkpoint rollout=1.ckpt: the weights under '' do not fit LlamaForCausalLM: "
            "48 missing (model.embed_tokens.weight, model.layers.0.self_attn.q_proj.weight, "
            "model.layers.0.self_attn.k_proj.weight, ...); 49 unexpected (policy.model.embed_tokens.weight, ",
        ),
        "missing": (2, "rlhf-lit: error: --checkpoint nowhere.ckpt: no such file or folder"),
        "empty folder": (2, "rlhf-lit: error: --checkpoint empty: a folder without rollout=<n>.ckpt files"),
    }[case]
    assert done.returncode == expected[0] and first.startswith(expected[1]), done.stderr
    assert not (tmp_path / "out").exists()

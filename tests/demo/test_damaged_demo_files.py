"""The demo and its studies meet a damaged file they read back (a cached result of an earlier run, a
model, a checkpoint policy) with one line naming it and exit 1, never a traceback
(``python -m demo``; the stages they run are ``rlhf-lit fit``: tests/cli/test_damaged_files.py)."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
from assets_paths import STORIES260K, TINYSTORIES

from demo.__main__ import main
from demo.rm_study import MARKER
from rlhf_lit.integrity import DamagedFile
from rlhf_lit.models.checkpoint_policy import load_checkpoint_policy


def test_a_cut_short_cached_sample_file_of_the_rm_study_is_named(tmp_path, capsys):
    out = tmp_path / "study"
    (out / "heldout").mkdir(parents=True)
    (out / MARKER).write_text(json.dumps({"written_by": "python -m demo rm-study"}) + "\n")
    samples = out / "heldout" / "samples.json"
    samples.write_text(json.dumps({"paragraphs": [1, 2], "prompts": ["a", "b"]})[:20])  # a crash mid-write
    status = main(["rm-study", "--sft", str(STORIES260K), "--out", str(out), "--report-only"])
    err = capsys.readouterr().err
    assert status == 1 and "Traceback" not in err
    assert err.startswith(f"error: {samples}: cut short (line 1, column ")
    assert "delete or restore it, then run the command again" in err


def test_a_damaged_policy_is_named_by_the_demo_evaluation(tmp_path, capsys, monkeypatch):
    # main() configures the root logger on the stream of the moment: this test's, and only for this test.
    for name in ("", "rlhf_lit"):  # (an in-process `rlhf-lit` run of another test may have left one on its stream)
        monkeypatch.setattr(logging.getLogger(name), "handlers", [])
    policy = shutil.copytree(STORIES260K, tmp_path / "policy")
    (policy / "model.safetensors").write_bytes((policy / "model.safetensors").read_bytes()[:1000])
    status = main(
        [
            "evaluate",
            "--policy",
            str(policy),
            "--reference",
            str(STORIES260K),
            "--paragraphs",
            str(TINYSTORIES),
            "--count",
            "2",
        ]
    )
    err = capsys.readouterr().err
    assert status == 1 and "Traceback" not in err
    assert f"{policy / 'model.safetensors'}: cut short (1000 bytes; its header alone says " in err


def test_a_damaged_checkpoint_policy_is_named(tmp_path):
    checkpoint = tmp_path / "rollout=2.ckpt"
    checkpoint.write_bytes(b"")
    with pytest.raises(DamagedFile, match=r"rollout=2\.ckpt: the file is empty \(0 bytes\)"):
        load_checkpoint_policy(str(checkpoint), str(STORIES260K))


def test_a_cut_short_preference_file_is_named_by_the_guard_study(tmp_path, capsys):
    demo = tmp_path / "demo"
    for folder in ("sft/model", "data", "prefs"):
        (demo / folder).mkdir(parents=True)
    (demo / "data" / "ppo.txt").write_text("Once upon a time\n")
    pair = json.dumps({"prompt": "a", "chosen": "b", "rejected": "c", "chosen_score": 1.0, "rejected_score": 0.0})
    prefs = demo / "prefs" / "preferences.jsonl"
    prefs.write_text(pair + "\n" + pair[:30])  # a copy cut short
    status = main(["guard", "--demo", str(demo), "--out", str(tmp_path / "guard")])
    err = capsys.readouterr().err
    assert status == 1 and "Traceback" not in err
    assert err.startswith(f"error: {prefs}: line 2: cut short (column "), err

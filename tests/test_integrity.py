"""The cheap checks of files rlhf-lit reads back (rlhf_lit/integrity.py), on files written here; the
same checks through `rlhf-lit` are tests/cli/test_damaged_files.py."""

from __future__ import annotations

import json
import shutil
import zipfile

import pytest
import torch
from assets_paths import STORIES260K
from safetensors.torch import save_file

from rlhf_lit.integrity import DamagedFile, check_checkpoint, check_model_directory, newest_intact_checkpoint


def test_a_checkpoint_whose_storages_repeat_names_every_record_and_misses_none(tmp_path):
    # Views share a storage and "storage" / "cpu" repeat: the pickle fetches them from its memo.
    base = torch.arange(10.0)
    torch.save({"a": base, "b": base[2:5], "c": {"d": torch.ones(3), "e": [torch.zeros(2)] * 2}}, tmp_path / "x.ckpt")
    check_checkpoint(tmp_path / "x.ckpt")


def test_a_sharded_model_names_a_missing_shard_and_other_json_files_are_not_the_models(tmp_path):
    model = shutil.copytree(STORIES260K, tmp_path / "model")
    (model / "trainer_state.json").write_text("[1, 2")  # not read by any loader: not checked
    check_model_directory(model)
    (model / "model.safetensors").unlink()
    save_file({"w": torch.ones(4)}, model / "model-00001-of-00002.safetensors")
    index = {
        "metadata": {},
        "weight_map": {"w": "model-00001-of-00002.safetensors", "v": "model-00002-of-00002.safetensors"},
    }
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(
        DamagedFile, match=r"model-00002-of-00002\.safetensors: missing \(named by model\.safetensors\.index\.json\)"
    ):
        check_model_directory(model)


def test_the_newest_intact_checkpoint_skips_damaged_ones(tmp_path):
    for step in (2, 4, 6):
        torch.save({"step": torch.tensor(step)}, tmp_path / f"step={step}.ckpt")
    (tmp_path / "step=6.ckpt").write_bytes(b"PK\x03\x04 cut")
    torch.save({"step": torch.tensor(7)}, tmp_path / "last.ckpt")
    (tmp_path / "last.ckpt").write_bytes(b"")
    assert newest_intact_checkpoint(tmp_path / "last.ckpt") == str(tmp_path / "step=4.ckpt")


@pytest.mark.parametrize("protocol", [2, 4])
def test_the_records_are_read_from_the_persistent_ids_alone(tmp_path, protocol):
    # A user's string "storage" before a class and a string is not a tensor record.
    note = ("storage", torch.float32, "9", "cpu", 1)  # shaped like a record, but no persistent id
    torch.save({"note": note, "w": torch.ones(2)}, tmp_path / "x.ckpt", pickle_protocol=protocol)
    check_checkpoint(tmp_path / "x.ckpt")


@pytest.mark.parametrize("protocol", [2, 4])
def test_a_record_missing_behind_memoised_names_is_found(tmp_path, protocol):
    # After the first tensor, "storage" and the device come back from the pickle's memo.
    torch.save(
        {"a": torch.ones(2), "b": torch.zeros(3), "c": torch.full((4,), 2.0)},
        tmp_path / "x.ckpt",
        pickle_protocol=protocol,
    )
    with zipfile.ZipFile(tmp_path / "x.ckpt") as whole, zipfile.ZipFile(tmp_path / "y.ckpt", "w") as part:
        for name in whole.namelist():
            if not name.endswith("/data/2"):
                part.writestr(name, whole.read(name))
    with pytest.raises(DamagedFile, match=r"1 tensor record\(s\) missing \(x/data/2 "):
        check_checkpoint(tmp_path / "y.ckpt")


def test_a_file_in_torchs_format_before_1_6_is_accepted(tmp_path):
    torch.save({"w": torch.ones(2)}, tmp_path / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    check_checkpoint(tmp_path / "pytorch_model.bin")


def test_a_jsonl_file_names_the_line_that_does_not_parse(tmp_path):
    from rlhf_lit.integrity import check_jsonl_file

    path = tmp_path / "prefs.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2}\n')
    assert check_jsonl_file(path) == [{"a": 1}, {"a": 2}]
    path.write_text('{"a": 1}\n{"a": 2')  # the write stopped in the last line
    with pytest.raises(DamagedFile, match=r"prefs\.jsonl: line 2: cut short \(column "):
        check_jsonl_file(path)
    path.write_text('{"a": 1}\n{"a" 2}\n{"a": 3}\n')
    with pytest.raises(DamagedFile, match=r"line 2: not valid JSON \(column 6"):
        check_jsonl_file(path)
    path.write_bytes(b"")
    with pytest.raises(DamagedFile, match=r"the file is empty"):
        check_jsonl_file(path)

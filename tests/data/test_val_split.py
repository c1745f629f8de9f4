"""``val_split``: a data module's validation data from a split of a hub dataset (offline: ``datasets`` stands in,
as in test_prompt_source.py, whose last test checks the stand-in's words against the real library)."""

from __future__ import annotations

import pytest
from data_assets import HH, write_jsonl
from hub_stand_in import fake_hub

from rlhf_lit.data import PreferenceDataModule, PromptDataModule, read_rows

TRAIN = [{"prompt": f"train prompt {i}"} for i in range(6)]
TEST = [{"prompt": f"test prompt {i}"} for i in range(3)]


def val_prompts(dm, tokenizer) -> list[str]:
    """The validation prompts a set-up module holds, decoded from its ids (BOS dropped)."""
    return [tokenizer.decode(item["input_ids"], skip_special_tokens=True) for item in dm.val_dataset]


def test_val_split_alone_reads_that_split_of_the_training_dataset(stories_tok, monkeypatch):
    calls = fake_hub(monkeypatch, {"train": TRAIN, "test": TEST})
    dm = PromptDataModule(tokenizer=stories_tok, train_path="org/prompts", val_split="test", batch_size=2)
    dm.setup("fit")
    assert calls == [("org/prompts", None, "train"), ("org/prompts", None, "test")]
    assert val_prompts(dm, stories_tok) == ["test prompt 0", "test prompt 1", "test prompt 2"]
    assert (dm.stats["train_records"], dm.stats["val_records"]) == (6, 3)
    assert dm.hparams["val_split"] == "test"  # recorded when set: a resume compares it


def test_val_split_of_another_dataset_and_val_path_without_it(stories_tok, monkeypatch):
    calls = fake_hub(monkeypatch, {"train": TRAIN, "validation": TEST})
    dm = PromptDataModule(tokenizer=stories_tok, train_path="org/a", val_path="org/b", val_split="validation")
    dm.setup("fit")
    assert calls == [("org/a", None, "train"), ("org/b", None, "validation")]
    calls.clear()
    before = PromptDataModule(tokenizer=stories_tok, train_path="org/a", val_path="org/b")  # as before: split
    before.setup("fit")
    assert calls == [("org/a", None, "train"), ("org/b", None, "train")]
    assert "val_split" not in before.hparams  # unset: the hyperparameters of a run before the option existed


def test_a_pair_dataset_s_test_split_holds_the_validation_pairs(stories_tok, monkeypatch):
    rows = [row.data for row in read_rows(str(HH), max_records=10)]
    calls = fake_hub(monkeypatch, {"train": rows[:6], "test": rows[6:]})
    dm = PreferenceDataModule(
        tokenizer=stories_tok,
        train_path="Anthropic/hh-rlhf",
        format="hh_rlhf",
        val_split="test",
        max_length=64,
        max_prompt_length=32,
    )
    dm.setup("fit")
    assert calls[-1] == ("Anthropic/hh-rlhf", None, "test")
    assert dm.stats["val_records"] == 4


def test_a_split_that_does_not_exist_names_the_dataset_the_split_and_those_it_has(stories_tok, monkeypatch):
    fake_hub(monkeypatch, {"train": TRAIN, "test": TEST})
    dm = PromptDataModule(tokenizer=stories_tok, train_path="org/prompts", val_split="test_prefs")
    with pytest.raises(
        ValueError, match=r"hub dataset 'org/prompts' split 'test_prefs': no such split; its splits: train, test"
    ):
        dm.setup("fit")


def test_val_split_where_no_split_can_be_read_is_refused_naming_the_options(stories_tok, tmp_path):
    local = write_jsonl(tmp_path / "p.jsonl", TRAIN)
    with pytest.raises(
        ValueError, match=r"val_split 'test' names a split of a hub dataset, but train_path .*p.jsonl is a local file"
    ):
        PromptDataModule(tokenizer=stories_tok, train_path=local, val_split="test")
    with pytest.raises(
        ValueError, match=r"val_split 'test' names a split of a hub dataset, but val_path .*p.jsonl is a local file"
    ):
        PromptDataModule(tokenizer=stories_tok, train_path="org/a", val_path=local, val_split="test")
    with pytest.raises(ValueError, match=r"give either val_split \('test'\) or val_fraction \(0.5\), not both"):
        PromptDataModule(tokenizer=stories_tok, train_path="org/a", val_split="test", val_fraction=0.5)

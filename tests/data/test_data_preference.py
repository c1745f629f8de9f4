"""Preference data: both sequences share the prompt, padded to one common length; margins."""

import sys
import types

import pytest
import torch
from data_assets import HH, write_jsonl

from rlhf_lit.data import Fields, PreferenceCollator, PreferenceDataModule
from rlhf_lit.data.records import read_rows

# stories260K ids: "Once upon a" -> 1 | 403 407 261; " time" -> 378; " time there was a cat" ->
# 378 383 286 261 280 294; "Hi" -> 1 | 320 417; " there" -> 383; EOS 2, pad 0
PAIRS = [
    {"prompt": "Once upon a", "chosen": " time there was a cat", "rejected": " time", "m": 1.5},
    {"prompt": "Hi", "chosen": " there", "rejected": " there", "m": 0},
]


def test_shapes_common_padding_and_margin(stories_tok, tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", PAIRS)
    dm = PreferenceDataModule(tokenizer=stories_tok, train_path=path, fields=Fields(margin="m"), batch_size=2)
    dm.setup("fit")
    batch = PreferenceCollator(dm.pad_token_id)(dm.train_dataset)
    assert batch["chosen_input_ids"].tolist() == [
        [1, 403, 407, 261, 378, 383, 286, 261, 280, 294, 2],
        [1, 320, 417, 383, 2, 0, 0, 0, 0, 0, 0],
    ]
    assert batch["rejected_input_ids"].tolist() == [
        [1, 403, 407, 261, 378, 2, 0, 0, 0, 0, 0],
        [1, 320, 417, 383, 2, 0, 0, 0, 0, 0, 0],
    ]
    assert batch["chosen_attention_mask"].tolist() == [[1] * 11, [1] * 5 + [0] * 6]
    assert batch["rejected_attention_mask"].tolist() == [[1] * 6 + [0] * 5, [1] * 5 + [0] * 6]
    assert batch["margin"].dtype == torch.float and batch["margin"].tolist() == [1.5, 0.0]
    assert batch["prompt_length"].dtype == torch.long and batch["prompt_length"].tolist() == [4, 3]  # BOS + prompt
    assert set(next(iter(dm.train_dataloader()))) == set(batch)


def test_no_margin_key_without_margin_field_and_truncation(stories_tok, tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", PAIRS[:1])
    dm = PreferenceDataModule(tokenizer=stories_tok, train_path=path, max_length=6, max_prompt_length=3)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    assert "margin" not in batch
    # prompt cut from the left to [1, 407, 261]; chosen cut to 3 tokens without EOS; " time" + EOS fits
    assert batch["chosen_input_ids"].tolist() == [[1, 407, 261, 378, 383, 286]]
    assert batch["rejected_input_ids"].tolist() == [[1, 407, 261, 378, 2, 0]]
    assert batch["rejected_attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0]]
    assert batch["prompt_length"].tolist() == [3]  # the truncated prompt


def test_missing_margin_is_an_error(stories_tok, tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [PAIRS[0], {k: v for k, v in PAIRS[1].items() if k != "m"}])
    dm = PreferenceDataModule(tokenizer=stories_tok, train_path=path, fields=Fields(margin="m"))
    message = r"p\.jsonl line 2: field 'm' missing \(record keys: prompt, chosen, rejected\)"
    with pytest.raises(ValueError, match=message):
        dm.setup()


def test_hh_asset_pairs(stories_tok):
    dm = PreferenceDataModule(
        tokenizer=stories_tok,
        train_path=str(HH),
        format="hh_rlhf",
        max_records=64,
        max_length=96,
        max_prompt_length=64,
        batch_size=8,
        val_fraction=0.25,
    )
    dm.setup("fit")
    assert dm.stats["val_examples"] == 16
    batch = next(iter(dm.val_dataloader()))
    c, r = batch["chosen_input_ids"], batch["rejected_input_ids"]
    assert c.shape == r.shape == batch["chosen_attention_mask"].shape and c.shape[0] == 8 and c.shape[1] <= 96
    for ids, mask in [(c, batch["chosen_attention_mask"]), (r, batch["rejected_attention_mask"])]:
        assert (ids[:, 0] == 1).all()  # BOS once in front
        for row, n in zip(ids.tolist(), mask.sum(1).tolist()):
            assert row[n - 1] == 2 or n == 96  # ends with EOS unless cut at max_length


def test_alpaca_is_rejected_for_preferences(stories_tok, tmp_path):
    with pytest.raises(ValueError, match="format 'alpaca' has no preference examples"):
        PreferenceDataModule(tokenizer=stories_tok, train_path="x.jsonl", format="alpaca")


def test_hub_name_goes_through_datasets(stories_tok, monkeypatch):
    local = [row.data for row in read_rows(str(HH), max_records=12)]
    calls = []

    def load_dataset(name, subset=None, split=None):
        calls.append((name, subset, split))
        return local

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    dm = PreferenceDataModule(
        tokenizer=stories_tok,
        train_path="Anthropic/hh-rlhf",
        format="hh_rlhf",
        split="test",
        max_records=8,
        max_length=64,
        max_prompt_length=32,
    )
    dm.setup("fit")
    assert calls == [("Anthropic/hh-rlhf", None, "test")]
    assert dm.stats["train_records"] == 8
    assert next(iter(dm.train_dataloader()))["chosen_input_ids"].shape[0] == 8


def test_extra_fields_reach_the_batch_and_are_kept_with_their_records(stories_tok, tmp_path):
    rows = [dict(p, n=n, scored_by="vader") for p, n in zip(PAIRS, (8, 4))]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    dm = PreferenceDataModule(tokenizer=stories_tok, train_path=path, extra_fields=["n", "scored_by"], batch_size=2)
    dm.setup()
    assert dm.extra_values("n") == [(f"{path} line 1", 8), (f"{path} line 2", 4)]
    assert dm.extra_values("scored_by") == [(f"{path} line 1", "vader"), (f"{path} line 2", "vader")]
    batch = next(iter(dm.train_dataloader()))
    assert sorted(batch["extras"]["n"]) == [4, 8] and batch["extras"]["scored_by"] == ["vader", "vader"]
    assert dm.hparams["extra_fields"] == ["n", "scored_by"]
    with pytest.raises(ValueError, match=r"'margin' is not among extra_fields \['n', 'scored_by'\]"):
        dm.extra_values("margin")


def test_extra_fields_unset_leave_batches_and_hparams_as_before(stories_tok, tmp_path):
    dm = PreferenceDataModule(tokenizer=stories_tok, train_path=write_jsonl(tmp_path / "p.jsonl", PAIRS))
    dm.setup()
    assert "extras" not in next(iter(dm.train_dataloader()))
    assert "extra_fields" not in dm.hparams  # a checkpoint written before the option resumes


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"extra_fields": ["n", "n"]}, r"extra_fields must not repeat a name, got \['n', 'n'\]"),
        ({"extra_fields": ["n"], "format": "rankings"}, r"extra_fields \(\['n'\]\) are read for pairs only"),
    ],
)
def test_bad_extra_fields_are_refused(stories_tok, tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        PreferenceDataModule(tokenizer=stories_tok, train_path=str(tmp_path / "p.jsonl"), **kwargs)


def test_a_record_without_an_extra_field_is_named(stories_tok, tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [dict(PAIRS[0], n=8), PAIRS[1]])
    dm = PreferenceDataModule(tokenizer=stories_tok, train_path=path, extra_fields=["n"])
    with pytest.raises(ValueError, match=r"p\.jsonl line 2: missing extra field\(s\) \['n'\] \(extra_fields\)"):
        dm.setup()

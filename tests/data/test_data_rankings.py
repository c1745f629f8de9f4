"""Ranking records (``format: rankings``): the ranking batch of docs/CONTRACTS.md, K = 2 equal to the
pair batch, the truncation and drop rules, and one-message errors for bad records."""

import importlib.util
import logging
import sys
from pathlib import Path

import pytest
import torch
import yaml
from assets_paths import CONFIGS, ROOT
from data_assets import TINYSTORIES, write_jsonl

from rlhf_lit.data import (
    Fields,
    PreferenceCollator,
    PreferenceDataModule,
    PromptDataModule,
    RankingCollator,
    SFTDataModule,
)
from rlhf_lit.data.adapters import Example
from rlhf_lit.functional.pairs import concat_pairs

# stories260K ids: "Once upon a" -> 1 | 403 407 261; " time" -> 378; " time there was a cat" ->
# 378 383 286 261 280 294; " dog" -> 400 428; "Hi" -> 1 | 320 417; " there" -> 383; " you" -> 364;
# EOS 2, pad 0
ONCE = [1, 403, 407, 261]
HI = [1, 320, 417]
MIXED = [
    {"prompt": "Once upon a", "responses": [" time there was a cat", " time", " dog"], "r": [5, 7, 7]},
    {"prompt": "Hi", "responses": [" there", " you"], "r": [-1, 4]},
]


def rankings(tok, path, **kwargs) -> PreferenceDataModule:
    dm = PreferenceDataModule(tokenizer=tok, train_path=str(path), format="rankings", **kwargs)
    dm.setup("fit")
    return dm


def test_mixed_batch_by_hand_with_a_tie(stories_tok, tmp_path):
    dm = rankings(stories_tok, write_jsonl(tmp_path / "r.jsonl", MIXED), fields=Fields(ranks="r"))
    batch = RankingCollator(dm.pad_token_id)(dm.train_dataset)
    rows = [  # position-major: first responses of both prompts, then the second ones, then the third
        ONCE + [378, 383, 286, 261, 280, 294, 2],
        HI + [383, 2],
        ONCE + [378, 2],
        HI + [364, 2],
        ONCE + [400, 428, 2],
    ]
    T = 11
    assert batch["input_ids"].tolist() == [r + [0] * (T - len(r)) for r in rows]
    assert batch["attention_mask"].tolist() == [[1] * len(r) + [0] * (T - len(r)) for r in rows]
    assert batch["group"].tolist() == [0, 1, 0, 1, 0]
    assert batch["rank"].tolist() == [0, 0, 1, 1, 1]  # ranks 5, 7, 7 -> 0, 1, 1 (a tie); -1, 4 -> 0, 1
    assert batch["responses_per_prompt"].tolist() == [3, 2]
    assert batch["prompt_length"].tolist() == [4, 3, 4, 3, 4]
    assert all(v.dtype == torch.long for v in batch.values())
    assert set(next(iter(dm.train_dataloader()))) == set(batch)  # the module's loader gives this format


def test_without_ranks_the_list_order_is_the_ranking(stories_tok, tmp_path):
    dm = rankings(stories_tok, write_jsonl(tmp_path / "r.jsonl", MIXED))
    batch = RankingCollator(dm.pad_token_id)(dm.train_dataset)
    assert batch["rank"].tolist() == [0, 0, 1, 1, 2]


def _paragraph_pairs(n: int) -> list[dict]:
    """Prompt, chosen and rejected cut out of TinyStories paragraphs, also as a 2-response ranking."""
    paragraphs = [p for p in Path(TINYSTORIES).read_text(encoding="utf-8").split("\n\n") if len(p.split()) > 12]
    records = []
    for i in range(n):
        words, other = paragraphs[2 * i].split(), paragraphs[2 * i + 1].split()
        prompt, chosen, rejected = " ".join(words[:6]), " " + " ".join(words[6:]), " " + " ".join(other[3 : 3 + i + 2])
        records.append({"prompt": prompt, "chosen": chosen, "rejected": rejected, "responses": [chosen, rejected]})
    return records


def test_k2_rankings_are_the_pair_batch_concatenated(stories_tok, tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", _paragraph_pairs(6))
    # max_length cuts some chosen responses (no EOS) and max_prompt_length some prompts
    options = {"max_length": 24, "max_prompt_length": 6}
    pairs = PreferenceDataModule(tokenizer=stories_tok, train_path=path, **options)
    pairs.setup("fit")
    ranked = rankings(stories_tok, path, **options)
    assert pairs.truncated["chosen response"] > 0 and pairs.stats["train_truncated_prompt"] > 0
    pair_batch = PreferenceCollator(0)(pairs.train_dataset)
    batch = RankingCollator(0)(ranked.train_dataset)
    ids, mask = concat_pairs(
        pair_batch["chosen_input_ids"],
        pair_batch["chosen_attention_mask"],
        pair_batch["rejected_input_ids"],
        pair_batch["rejected_attention_mask"],
        0,
    )
    assert torch.equal(batch["input_ids"], ids) and torch.equal(batch["attention_mask"], mask)
    B = 6
    assert batch["group"].tolist() == list(range(B)) * 2
    assert batch["rank"].tolist() == [0] * B + [1] * B
    assert batch["responses_per_prompt"].tolist() == [2] * B
    assert torch.equal(batch["prompt_length"], pair_batch["prompt_length"].repeat(2))


def test_truncation_is_the_pair_rule(stories_tok, tmp_path):
    dm = rankings(stories_tok, write_jsonl(tmp_path / "r.jsonl", MIXED[:1]), max_length=6, max_prompt_length=3)
    # prompt cut from the left to [1, 407, 261]; the first response cut to 3 tokens without EOS
    assert dm.train_dataset == [
        {
            "input_ids": [[1, 407, 261, 378, 383, 286], [1, 407, 261, 378, 2], [1, 407, 261, 400, 428, 2]],
            "rank": [0, 1, 2],
            "prompt_length": 3,
        }
    ]
    assert dm.stats["train_truncated_prompt"] == 1 and dm.stats["train_truncated_ranked_response"] == 1


class _StubEncoder:
    """Responses "" keep no token (a real tokenizer gives none for some texts, e.g. under a chat template)."""

    prefix = [1]
    eos_token_id = 2
    IDS = {"a": [7], "b": [8], "c": [9], "": []}

    def encode_pairs(self, prompts, responses):
        return [[1, 5] for _ in prompts], [list(self.IDS[r]) for r in responses], [self.eos_token_id for _ in responses]


def test_responses_without_tokens_are_dropped_and_counted(stories_tok, caplog):
    dm = PreferenceDataModule(
        tokenizer=stories_tok, train_path="unused.jsonl", format="rankings", fields=Fields(ranks="r")
    )
    examples = [
        Example("l1", "p", responses=("a", "", "b"), ranks=(0, 1, 2)),  # keeps a, b: ranks 0, 2 -> 0, 1
        Example("l2", "p", responses=("", "a", "b"), ranks=(0, 1, 1)),  # keeps a tie only: dropped
        Example("l3", "p", responses=("a", "b", "c"), ranks=(0, 0, 1)),
    ]
    with caplog.at_level(logging.INFO, logger="rlhf_lit.data"):
        items = dm._encode_split(_StubEncoder(), examples, "train")
    assert items == [
        {"input_ids": [[1, 5, 7, 2], [1, 5, 8, 2]], "rank": [0, 1], "prompt_length": 2},
        {"input_ids": [[1, 5, 7, 2], [1, 5, 8, 2], [1, 5, 9, 2]], "rank": [0, 0, 1], "prompt_length": 2},
    ]
    assert dm.stats == {"train_records": 3, "train_examples": 2, "train_dropped": 1, "train_dropped_responses": 2}
    assert [r.getMessage() for r in caplog.records] == [
        "train: dropped 1 of 3 examples whose response keeps no token after truncation",
        "train: dropped 2 of 9 ranked responses that keep no token after truncation "
        "(a ranking left with fewer than 2 ranks is dropped whole)",
    ]


BAD = [
    ({"prompt": "Hi"}, "field 'responses' missing (record keys: prompt)"),
    ({"prompt": "Hi", "responses": " there"}, "field 'responses' must be a list of strings, got str"),
    ({"prompt": "Hi", "responses": [" there"]}, "field 'responses' must hold at least 2 responses, got 1"),
    ({"prompt": "Hi", "responses": [" a", " b", 3]}, "field 'responses[2]' must be a string, got int"),
    ({"prompt": "Hi", "responses": [" a", "  "]}, "field 'responses[1]' is empty"),
    (
        {"prompt": "Hi", "responses": [" a", " b", " a"]},
        "field 'responses[2]' repeats 'responses[0]' (responses must differ)",
    ),
    (
        {"prompt": "Hi", "responses": [" a", " b"], "r": [0]},
        "field 'r' must be a list of 2 ints (one per response), got 1 values",
    ),
    ({"prompt": "Hi", "responses": [" a", " b"], "r": [0, 1.5]}, "field 'r[1]' must be an int, got float"),
    ({"prompt": "Hi", "responses": [" a", " b"], "r": [0, True]}, "field 'r[1]' must be an int, got bool"),
    ({"prompt": "Hi", "responses": [" a", " b"]}, "field 'r' missing (record keys: prompt, responses)"),
    (
        {"prompt": "Hi", "responses": [" a", " b"], "r": [1, 0]},
        "field 'r[1]' is 0, below 'r[0]' (1): responses are listed best first and a lower rank is better, so ranks never decrease",
    ),
]


@pytest.mark.parametrize("record, message", BAD)
def test_bad_records_name_the_file_line_and_field(stories_tok, tmp_path, record, message):
    path = write_jsonl(tmp_path / "r.jsonl", [MIXED[1], record])
    dm = PreferenceDataModule(tokenizer=stories_tok, train_path=path, format="rankings", fields=Fields(ranks="r"))
    with pytest.raises(ValueError) as error:
        dm.setup()
    assert str(error.value) == f"{path} line 2: {message}"


def test_skip_invalid_skips_and_counts_bad_rankings(stories_tok, tmp_path, caplog):
    path = write_jsonl(tmp_path / "r.jsonl", [MIXED[0], *(record for record, _ in BAD), MIXED[1]])
    with caplog.at_level(logging.INFO, logger="rlhf_lit.data"):
        dm = rankings(stories_tok, path, fields=Fields(ranks="r"), skip_invalid=True)
    assert dm.stats["train_records"] == 2
    assert f"{path}: skipped {len(BAD)} of {len(BAD) + 2} invalid records (skip_invalid=True)" in caplog.text


def test_an_all_tied_ranking_is_skipped_and_counted(stories_tok, tmp_path, caplog):
    path = write_jsonl(tmp_path / "r.jsonl", [MIXED[0], {"prompt": "Hi", "responses": [" a", " b"], "r": [3, 3]}])
    with caplog.at_level(logging.INFO, logger="rlhf_lit.data"):
        dm = rankings(stories_tok, path, fields=Fields(ranks="r"))
    assert dm.stats["train_records"] == 1
    assert f"{path}: skipped 1 of 2 records (all responses tie (no pair to learn from))" in caplog.text


@pytest.mark.parametrize(
    "format, fields, message",
    [
        (
            "rankings",
            Fields(margin="m"),
            "fields.margin is set ('m') but format 'rankings' has no margin: a ranking only "
            "orders its responses (ties through fields.ranks); unset fields.margin",
        ),
        (
            "fields",
            Fields(ranks="r"),
            "fields.ranks is set ('r') but only format 'rankings' reads it (format is 'fields')",
        ),
    ],
)
def test_columns_the_format_cannot_use_are_refused(stories_tok, format, fields, message):
    with pytest.raises(ValueError) as error:
        PreferenceDataModule(tokenizer=stories_tok, train_path="x.jsonl", format=format, fields=fields)
    assert str(error.value) == message


def test_validation_split_gives_ranking_batches(stories_tok, tmp_path):
    records = [{"prompt": p["prompt"], "responses": p["responses"]} for p in _paragraph_pairs(8)]
    dm = rankings(stories_tok, write_jsonl(tmp_path / "r.jsonl", records), val_fraction=0.25, batch_size=4)
    assert dm.stats["val_examples"] == 2 and dm.stats["train_examples"] == 6
    batch = next(iter(dm.val_dataloader()))
    assert batch["responses_per_prompt"].tolist() == [2, 2] and batch["group"].tolist() == [0, 1, 0, 1]


def test_sft_reads_the_first_best_response_and_prompts_the_prompt(stories_tok, tmp_path):
    tied_best = {"prompt": "Hi", "responses": [" you", " there", " dog"], "r": [0, 0, 1]}
    path = write_jsonl(tmp_path / "r.jsonl", [MIXED[0], tied_best])
    sft = SFTDataModule(tokenizer=stories_tok, train_path=path, format="rankings", fields=Fields(ranks="r"))
    sft.setup()
    assert [x["input_ids"] for x in sft.train_dataset] == [ONCE + [378, 383, 286, 261, 280, 294, 2], HI + [364, 2]]
    prompts = PromptDataModule(tokenizer=stories_tok, train_path=path, format="rankings")
    prompts.setup()
    assert [x["input_ids"] for x in prompts.train_dataset] == [ONCE, HI]


RANKINGS = Path(TINYSTORIES).parent / "rankings.jsonl"


def test_the_shipped_sample_is_read_with_the_offline_config(stories_tok):
    config = yaml.safe_load((CONFIGS / "offline" / "reward_model_rankings.yaml").read_text(encoding="utf-8"))
    options = config["data"]["init_args"]
    assert options["train_path"] == "assets/data/tinystories/rankings.jsonl" and options["format"] == "rankings"
    options = {**options, "train_path": str(ROOT / options["train_path"])}
    dm = PreferenceDataModule(tokenizer=stories_tok, **options)
    dm.setup("fit")
    assert dm.stats["train_records"] + dm.stats["val_records"] == 320  # nothing skipped or invalid
    assert dm.stats["train_dropped"] == dm.stats["val_dropped"] == 0
    batch = next(iter(dm.train_dataloader()))
    assert set(batch["responses_per_prompt"].tolist()) == {3, 4}
    ties = [item["rank"] for item in dm.train_dataset if len(set(item["rank"])) < len(item["rank"])]
    assert ties and all(r == sorted(r) and r[0] == 0 for r in ties)


def test_the_shipped_sample_is_what_its_script_writes(tmp_path, monkeypatch):
    monkeypatch.setattr(
        sys, "dont_write_bytecode", True
    )  # no __pycache__ among the shipped assets (tests/test_assets.py)
    spec = importlib.util.spec_from_file_location("make_rankings", RANKINGS.parent / "make_rankings.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.write(tmp_path / "rankings.jsonl") == 320
    assert (tmp_path / "rankings.jsonl").read_bytes() == RANKINGS.read_bytes()


def test_hparams_of_other_runs_keep_their_keys_and_rankings_columns_are_stored_when_set(stories_tok, tmp_path):
    pairs = PreferenceDataModule(tokenizer=stories_tok, train_path="x.jsonl")
    assert set(pairs.hparams["fields"]) == {"prompt", "response", "chosen", "rejected", "margin", "text"}
    dm = PreferenceDataModule(
        tokenizer=stories_tok, train_path="x.jsonl", format="rankings", fields=Fields(responses="rs", ranks="r")
    )
    assert dm.hparams["fields"]["responses"] == "rs" and dm.hparams["fields"]["ranks"] == "r"
    assert Fields(**dm.hparams["fields"]) == dm.fields  # what a checkpoint's hparams rebuild

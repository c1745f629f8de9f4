"""Format ``auto``: the format picked from a source's first record, its log line and its errors."""

import logging

import pytest
from data_assets import HH, TINYSTORIES, write_jsonl

from rlhf_lit.data import Fields, PreferenceDataModule, PromptDataModule, SFTDataModule
from rlhf_lit.data.detect import detect_format, resolve_format
from rlhf_lit.data.records import Row

USER = {"role": "user", "content": "Hi"}
ASSISTANT = {"role": "assistant", "content": "Hello"}

# (first record, kind, the format auto must pick)
PICKS = [
    ({"messages": [USER, ASSISTANT]}, "sft", "messages"),
    ({"messages": [USER, ASSISTANT]}, "prompt", "messages"),
    ({"prompt": "p", "responses": ["a", "b"]}, "preference", "rankings"),
    ({"prompt": "p", "responses": ["a", "b"]}, "prompt", "rankings"),
    ({"prompt": "p", "chosen": "a", "rejected": "b"}, "preference", "fields"),
    ({"prompt": [USER], "chosen": [ASSISTANT], "rejected": "No"}, "preference", "fields"),
    ({"prompt": "p", "chosen": "a", "rejected": "b"}, "prompt", "fields"),
    (
        {"chosen": "\n\nHuman: Hi\n\nAssistant: Yo", "rejected": "\n\nHuman: Hi\n\nAssistant: No"},
        "preference",
        "hh_rlhf",
    ),
    ({"chosen": "Hi\n\nAssistant: Yo", "rejected": "x"}, "preference", "hh_rlhf"),  # holds the marker
    ({"chosen": "The sky is blue.", "rejected": "The sky is red."}, "preference", "implicit_prompt"),
    (
        {"chosen": [USER, ASSISTANT], "rejected": [USER, {"role": "assistant", "content": "No"}]},
        "prompt",
        "implicit_prompt",
    ),
    ({"prompt": "p", "completion": "c"}, "sft", "prompt_completion"),
    ({"prompt": [USER], "completion": [ASSISTANT]}, "prompt", "prompt_completion"),
    ({"prompt": "p", "response": "r"}, "sft", "fields"),
    ({"instruction": "i", "input": "", "output": "o"}, "sft", "alpaca"),
    ({"text": "Once upon a time"}, "sft", "text"),
    ({"text": "Once upon a time"}, "prompt", "paragraphs"),
    ({"prompt": "p"}, "prompt", "fields"),
    # a record with pairs and rankings is read as pairs, as the format "fields" read it before auto
    ({"prompt": "p", "chosen": "a", "rejected": "b", "responses": ["a", "b"]}, "preference", "fields"),
    # HuggingFaceH4/ultrafeedback_binarized's train_prefs: pairs with a messages column, read as pairs for
    # pairs and as the conversation for SFT
    (
        {"prompt": "p", "chosen": [USER, ASSISTANT], "rejected": [USER, ASSISTANT], "messages": [USER, ASSISTANT]},
        "preference",
        "fields",
    ),
    (
        {"prompt": "p", "chosen": [USER, ASSISTANT], "rejected": [USER, ASSISTANT], "messages": [USER, ASSISTANT]},
        "sft",
        "messages",
    ),
]


@pytest.mark.parametrize(("record", "kind", "format"), PICKS)
def test_auto_picks_the_format_from_the_first_record(record, kind, format):
    assert detect_format(Row("d.jsonl line 1", record), kind, Fields(), "d.jsonl") == format


def test_renamed_columns_are_looked_for_under_their_names():
    fields = Fields(prompt="question", response="answer", responses="ranked")
    assert detect_format(Row("w", {"question": "q", "answer": "a"}), "sft", fields, "d") == "fields"
    assert detect_format(Row("w", {"question": "q", "ranked": ["a", "b"]}), "preference", fields, "d") == "rankings"


def test_one_info_line_names_the_source_format_and_keys(stories_tok, tmp_path, caplog):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "Once upon a", "completion": " time", "id": 7}])
    with caplog.at_level(logging.INFO, logger="rlhf_lit.data"):
        dm = SFTDataModule(tokenizer=stories_tok, train_path=path)
        dm.setup()
    lines = [r.getMessage() for r in caplog.records if "format auto" in r.getMessage()]
    assert lines == [f"{path}: format auto read as prompt_completion (record 1 keys: prompt, completion, id)"]
    assert dm.format == "prompt_completion" and dm.hparams["format"] == "prompt_completion"


def test_an_undecidable_record_is_one_error_naming_source_record_and_keys(stories_tok, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": "a"}])
    with pytest.raises(ValueError) as e:
        SFTDataModule(tokenizer=stories_tok, train_path=path).setup()
    assert str(e.value) == (
        f"{path} record 1 ({path} line 1): cannot tell the record format from its keys (question, answer); set "
        "format: one of fields, hh_rlhf, alpaca, paragraphs, rankings, messages, prompt_completion, "
        "implicit_prompt, text"
    )


@pytest.mark.parametrize(
    ("module", "record", "message"),
    [
        (
            SFTDataModule,
            {"prompt": "p", "chosen": "a", "rejected": "b"},
            "looks like fields (keys prompt, chosen, rejected), which has no sft examples under format auto; set "
            "format: fields and fields.response: chosen to train on the chosen responses",
        ),
        (
            SFTDataModule,
            {"chosen": "The sky is blue.", "rejected": "The sky is red."},
            "looks like implicit_prompt (keys chosen, rejected), which has no sft examples under format auto; set "
            "format: implicit_prompt to train on the prompt and the chosen (best) response",
        ),
        (
            SFTDataModule,
            {"prompt": "p"},
            "looks like fields (keys prompt), which has no sft examples under format auto; sft data needs one of the "
            "formats fields, hh_rlhf, alpaca, paragraphs, rankings, messages, prompt_completion, implicit_prompt, text",
        ),
        (
            PreferenceDataModule,
            {"messages": [USER, ASSISTANT]},
            "looks like messages (keys messages), which has no preference examples under format auto; preference data "
            "needs one of the formats fields, hh_rlhf, rankings, implicit_prompt",
        ),
        (
            PreferenceDataModule,
            {"prompt": "p", "response": "r"},
            "looks like fields (keys prompt, response), which has no preference examples under format auto; preference "
            "data needs one of the formats fields, hh_rlhf, rankings, implicit_prompt",
        ),
    ],
)
def test_a_record_of_the_wrong_kind_is_one_error_saying_what_it_looks_like(
    stories_tok, tmp_path, module, record, message
):
    path = write_jsonl(tmp_path / "d.jsonl", [record])
    with pytest.raises(ValueError) as e:
        module(tokenizer=stories_tok, train_path=path).setup()
    assert str(e.value) == f"{path} record 1 ({path} line 1): {message}"


def test_plain_text_is_paragraphs_and_the_shipped_sets_resolve(stories_tok):
    assert resolve_format("auto", [], kind="sft", fields=Fields(), source="x.txt", text_file=True) == "paragraphs"
    assert resolve_format("alpaca", [], kind="sft", fields=Fields(), source="x", text_file=False) == "alpaca"
    sft = SFTDataModule(
        tokenizer=stories_tok, train_path=str(TINYSTORIES), max_records=20, max_length=64, max_prompt_length=16
    )
    sft.setup()
    explicit = SFTDataModule(
        tokenizer=stories_tok,
        train_path=str(TINYSTORIES),
        format="paragraphs",
        max_records=20,
        max_length=64,
        max_prompt_length=16,
    )
    explicit.setup()
    assert sft.format == "paragraphs" and sft.train_dataset == explicit.train_dataset
    prompts = PromptDataModule(tokenizer=stories_tok, train_path=str(HH), max_records=8, max_prompt_length=64)
    prompts.setup()
    assert prompts.format == "hh_rlhf"


def test_second_sources_resolve_on_their_own_and_unused_ones_record_the_old_default(stories_tok, tmp_path):
    pairs = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Once upon a", "chosen": " time", "rejected": " day"}])
    demos = write_jsonl(tmp_path / "s.jsonl", [{"prompt": "Once upon a", "completion": " time"}])
    dm = PreferenceDataModule(tokenizer=stories_tok, train_path=pairs, reference_path=demos)
    dm.setup()
    assert (dm.format, dm.reference_format) == ("fields", "prompt_completion")
    assert (dm.hparams["format"], dm.hparams["reference_format"]) == ("fields", "prompt_completion")
    # no reference set: its format reads nothing and is recorded as the default before auto, "fields"
    assert PreferenceDataModule(tokenizer=stories_tok, train_path=pairs).hparams["reference_format"] == "fields"
    prompts = PromptDataModule(
        tokenizer=stories_tok, train_path=demos, ptx_path=str(TINYSTORIES), ptx_max_records=4, max_prompt_length=8
    )
    prompts.setup()
    assert (prompts.format, prompts.ptx_format) == ("prompt_completion", "paragraphs")
    assert PromptDataModule(tokenizer=stories_tok, train_path=demos).hparams["ptx_format"] == "fields"

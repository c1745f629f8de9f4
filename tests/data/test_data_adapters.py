"""Format adapters on hand-written records and on the real assets."""

import logging

import pytest
from data_assets import ALPACA_V1, HH

from rlhf_lit.data.adapters import AdapterOptions, Example, Fields, adapt, check_format
from rlhf_lit.data.records import InvalidRecord, Row, read_rows

OPT = AdapterOptions(Fields(), prompt_words=3)

HH_RECORDS = [
    Row(
        "hh line 1",
        {
            "chosen": "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Help me?\n\nAssistant: Sure.",
            "rejected": "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Help me?\n\nAssistant: No.",
        },
    ),
    Row(
        "hh line 2",
        {
            "chosen": "\n\nHuman: Name a color\n\nAssistant: Blue",
            "rejected": "\n\nHuman: Name a colour\n\nAssistant: Red",  # prompt differs: skipped
        },
    ),
]


def test_hh_split_at_last_assistant_marker():
    out = adapt(HH_RECORDS, format="hh_rlhf", kind="preference", options=OPT)
    assert out.examples == [
        Example(
            "hh line 1",
            prompt="\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Help me?\n\nAssistant:",
            chosen=" Sure.",
            rejected=" No.",
        )
    ]
    assert dict(out.skipped) == {"chosen and rejected do not share the prompt up to the last '\\n\\nAssistant:'": 1}


def test_hh_sft_is_prompt_plus_chosen_and_prompts_the_prompt():
    sft = adapt(HH_RECORDS, format="hh_rlhf", kind="sft", options=OPT).examples
    assert [(e.prompt, e.response) for e in sft] == [
        ("\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Help me?\n\nAssistant:", " Sure."),
        ("\n\nHuman: Name a color\n\nAssistant:", " Blue"),
    ]
    prompts = adapt(HH_RECORDS, format="hh_rlhf", kind="prompt", options=OPT).examples
    assert [e.prompt for e in prompts] == [e.prompt for e in sft]


def test_hh_asset_skips_5_of_2312_without_shared_prompt(caplog):
    rows = read_rows(str(HH))
    with caplog.at_level(logging.INFO, logger="rlhf_lit.data"):
        out = adapt(rows, format="hh_rlhf", kind="preference", options=OPT, source="hh")
    reason = "chosen and rejected do not share the prompt up to the last '\\n\\nAssistant:'"
    assert len(rows) == 2312
    assert out.skipped[reason] == 5
    # 4 more pairs share the prompt but their chosen turn after the last marker is empty
    assert out.skipped["empty chosen after the last '\\n\\nAssistant:'"] == 4
    assert len(out.examples) == 2312 - 5 - 4
    assert f"hh: skipped 5 of 2312 records ({reason})" in [r.getMessage() for r in caplog.records]
    assert all(e.prompt.endswith("\n\nAssistant:") for e in out.examples)


def test_alpaca_template_and_status_filter():
    rows = [
        Row("l1", {"instruction": "Add.", "input": "1 and 2", "output": " 3 ", "status": "ok"}),
        Row("l2", {"instruction": "Say hi.", "input": "", "output": "hi", "status": "ok"}),
        Row("l3", {"instruction": "x", "input": "", "output": "y", "status": "too similar"}),
        Row("l4", {"instruction": "Sing.", "input": "<noinput>", "output": "la"}),  # no status
    ]
    out = adapt(rows, format="alpaca", kind="sft", options=OPT)
    assert [(e.prompt, e.response) for e in out.examples] == [
        ("Add.\n\nInput:\n1 and 2\n\nResponse:\n", "3"),
        ("Say hi.\n\nResponse:\n", "hi"),
        ("Sing.\n\nResponse:\n", "la"),
    ]
    assert dict(out.skipped) == {"status != 'ok'": 1}


def test_alpaca_asset_status_ok_and_empty_outputs():
    rows = read_rows(str(ALPACA_V1))
    # v1 has 1202 status-ok rows, 29 of which have an empty output: invalid data, an error ...
    with pytest.raises(InvalidRecord, match=r"alpaca_libre_tasks_v1\.jsonl line 150: field 'output' is empty"):
        adapt(rows, format="alpaca", kind="sft", options=OPT)
    # ... unless skip_invalid; for prompts the output is not read
    out = adapt(rows, format="alpaca", kind="sft", options=OPT, skip_invalid=True)
    assert (len(out.examples), out.invalid, out.skipped["status != 'ok'"]) == (1202 - 29, 29, 2375 - 1202)
    assert len(adapt(rows, format="alpaca", kind="prompt", options=OPT).examples) == 1202


def test_paragraphs_split_after_prompt_words():
    rows = [
        Row("p1", {"text": "One two  three four five."}),
        Row("p2", {"text": "Too short here"}),  # 3 words = prompt_words: nothing to continue
    ]
    out = adapt(rows, format="paragraphs", kind="sft", options=OPT)
    assert [(e.prompt, e.response) for e in out.examples] == [("One two  three", " four five.")]
    assert dict(out.skipped) == {"at most prompt_words=3 words": 1}
    prompts = adapt(rows, format="paragraphs", kind="prompt", options=OPT).examples
    assert [e.prompt for e in prompts] == ["One two  three"]


def test_field_mapping_and_margin():
    fields = Fields(prompt="q", response="a", chosen="good", rejected="bad", margin="m")
    opt = AdapterOptions(fields, prompt_words=3)
    rows = [Row("r0", {"q": "Q?", "a": "A.", "good": "yes", "bad": "no", "m": 2})]
    assert adapt(rows, format="fields", kind="sft", options=opt).examples == [Example("r0", "Q?", response="A.")]
    assert adapt(rows, format="fields", kind="preference", options=opt).examples == [
        Example("r0", "Q?", chosen="yes", rejected="no", margin=2.0)
    ]
    bad = [Row("data/x.jsonl line 17", {"q": "Q?", "good": "yes", "m": 1})]
    message = r"^data/x\.jsonl line 17: field 'bad' missing \(record keys: q, good, m\)$"
    with pytest.raises(InvalidRecord, match=message):
        adapt(bad, format="fields", kind="preference", options=opt)


def test_skip_invalid_counts_bad_records(caplog):
    rows = [Row("l1", {"prompt": "p", "response": "r"}), Row("l2", {"prompt": 5, "response": "r"})]
    with pytest.raises(InvalidRecord, match="l2: field 'prompt' must be a string, got int"):
        adapt(rows, format="fields", kind="sft", options=OPT)
    with caplog.at_level(logging.INFO, logger="rlhf_lit.data"):
        out = adapt(rows, format="fields", kind="sft", options=OPT, skip_invalid=True, source="s")
    assert (len(out.examples), out.invalid) == (1, 1)
    assert [r.getMessage() for r in caplog.records] == [
        "s: skipped 1 of 2 invalid records (skip_invalid=True); first: l2: field 'prompt' must be a string, got int"
    ]


def test_unsupported_format_kind_combinations():
    check_format("hh_rlhf", "preference")
    with pytest.raises(ValueError, match="format 'alpaca' has no preference examples; .* fields, hh_rlhf"):
        check_format("alpaca", "preference")
    with pytest.raises(ValueError, match="unknown format 'csv'"):
        check_format("csv", "sft")

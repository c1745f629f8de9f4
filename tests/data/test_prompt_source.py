"""Prompt sources (rlhf_lit.data.prompt_source): files, hub datasets and lists read as the data modules read them.

Expected prompts are written by hand from the files the tests write, or from the first record of the shipped
HH-RLHF test file (``assets/data/hh-rlhf/harmless-base-test.jsonl.gz``; its first ``chosen`` transcript is
quoted in the test).
"""

from __future__ import annotations

import gzip

import pytest
from assets_paths import STORIES260K_CHAT
from data_assets import HH, bot, system, user, write_jsonl
from hub_stand_in import fake_hub

from rlhf_lit.data.prompt_source import PromptSource, given_prompts, read_prompt_source
from rlhf_lit.data.records import _read_hub
from rlhf_lit.tokenizer import load_tokenizer

FIRST_HUMAN = "what are some pranks with a pen i can do?"
LAST_HUMAN = "okay some of these do not have anything to do with pens"
"""The first and last human turns of the first HH record's chosen transcript (its last assistant turn follows)."""


def prompts_of(source, tokenizer=None, chat_template="auto") -> list:
    return read_prompt_source(source, tokenizer, chat_template).prompts


def test_a_text_file_is_one_prompt_per_line_kept_as_written_gzipped_too(tmp_path):
    text = "Once upon a time\n\n  The cat \r\n   \nTom\n"
    (tmp_path / "p.txt").write_text(text, encoding="utf-8")
    (tmp_path / "p.txt.gz").write_bytes(gzip.compress(text.encode()))
    for name in ("p.txt", "p.txt.gz"):
        assert prompts_of(str(tmp_path / name)) == ["Once upon a time", "  The cat ", "Tom"]
    # read as the data modules read a .txt: paragraphs, the first prompt_words (8) words of each
    (tmp_path / "s.txt").write_text("one two three four five six seven eight nine ten\n", encoding="utf-8")
    assert prompts_of(PromptSource(path=str(tmp_path / "s.txt"), format="paragraphs")) == [
        "one two three four five six seven eight"
    ]


def test_records_their_field_and_errors_that_name_the_line(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", ['{"prompt": "a b", "x": 1}', "", '{"text": "c", "prompt": "d"}'])
    assert prompts_of(path) == ["a b", "d"]
    with pytest.raises(ValueError, match=r"p.jsonl line 1: field 'text' missing \(record keys: prompt, x\)"):
        prompts_of(PromptSource(path=path, field="text"))
    write_jsonl(tmp_path / "p.jsonl", ['{"prompt": "a"}', '{"prompt": '])
    with pytest.raises(ValueError, match=r"p.jsonl line 2: not valid JSON"):
        prompts_of(path)
    write_jsonl(tmp_path / "p.jsonl", ['{"prompt": 3}'])
    with pytest.raises(ValueError, match=r"p.jsonl line 1: field 'prompt' must be a string, got int"):
        prompts_of(path)
    lines = tmp_path / "p.txt"
    lines.write_text('{"prompt": "a"}\n', encoding="utf-8")
    assert prompts_of(str(lines)) == ['{"prompt": "a"}']  # a text file: a line is a prompt
    assert prompts_of(PromptSource(path=str(lines), format="jsonl")) == ["a"]


def test_a_named_field_holds_the_prompt_whatever_else_the_records_hold(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"text": "Once upon a time there was a cat who sat"}])
    # auto alone reads a text column as paragraphs (the first 8 words); a named field is the whole prompt
    assert prompts_of(path) == ["Once upon a time there was a cat"]
    assert prompts_of(PromptSource(path=path, field="text")) == ["Once upon a time there was a cat who sat"]


def test_conversations_are_checked_as_the_data_modules_check_them(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": [system("Be kind."), user("Hi")]}, {"prompt": "The cat"}])
    assert prompts_of(path) == [(system("Be kind."), user("Hi")), "The cat"]
    write_jsonl(tmp_path / "p.jsonl", [{"prompt": [user("Hi"), bot("Yo")]}])
    with pytest.raises(ValueError, match=r"p.jsonl line 1: field 'prompt\[1\]' ends the prompt on an assistant turn"):
        prompts_of(path)
    write_jsonl(tmp_path / "p.jsonl", [{"prompt": [{"role": "bot", "content": "Hi"}]}])
    with pytest.raises(ValueError, match=r"p.jsonl line 1: field 'prompt\[0\]' has role 'bot'"):
        prompts_of(path)


def test_a_messages_file_gives_each_conversation_without_its_last_assistant_turn(tmp_path):
    path = write_jsonl(
        tmp_path / "m.jsonl",
        [{"messages": [system("S"), user("Q1"), bot("A1"), user("Q2"), bot("A2")]}, {"messages": [user("Hi")]}],
    )
    assert prompts_of(path) == [(system("S"), user("Q1"), bot("A1"), user("Q2")), (user("Hi"),)]


def test_hh_transcripts_are_cut_at_the_last_human_turn_as_the_tokenizer_reads_them():
    # the first record's chosen transcript, by hand: Human, Assistant, Human, Assistant, Human, Assistant
    strings = prompts_of(PromptSource(path=str(HH), max_prompts=1))
    assert strings[0].startswith(f"\n\nHuman: {FIRST_HUMAN}\n\nAssistant: Are you looking for practical joke ideas?")
    assert strings[0].endswith(f"\n\nHuman: {LAST_HUMAN}\n\nAssistant:")
    assert strings[0].count("\n\nHuman:") == 3 and strings[0].count("\n\nAssistant:") == 3
    chat = load_tokenizer(str(STORIES260K_CHAT))
    (conversation,) = prompts_of(PromptSource(path=str(HH), max_prompts=1), chat)
    assert [m["role"] for m in conversation] == ["user", "assistant", "user", "assistant", "user"]
    assert (conversation[0]["content"], conversation[-1]["content"]) == (FIRST_HUMAN, LAST_HUMAN)
    # never: the strings, whatever the tokenizer; a source read in full: every record that has a prompt
    assert prompts_of(PromptSource(path=str(HH), max_prompts=1), chat, "never") == strings
    assert len(prompts_of(str(HH))) == 2312


def test_skip_and_max_prompts_cut_what_is_read(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": p} for p in "abcde"])
    assert prompts_of(PromptSource(path=path, skip=1, max_prompts=3)) == ["b", "c", "d"]
    with pytest.raises(ValueError, match=r"p.jsonl: no prompts left after skip 5 \(it holds 5\)"):
        prompts_of(PromptSource(path=path, skip=5))


def test_bad_files_are_named(tmp_path):
    not_gzip = tmp_path / "p.jsonl.gz"
    not_gzip.write_text('{"prompt": "a"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"p.jsonl.gz: not a complete gzip file"):
        prompts_of(str(not_gzip))
    (tmp_path / "e.txt").write_text("\n  \n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"e.txt: no usable prompt examples in 0 records"):
        prompts_of(str(tmp_path / "e.txt"))
    with pytest.raises(FileNotFoundError, match=r"data file not found: .*missing.txt"):
        prompts_of(str(tmp_path / "missing.txt"))
    with pytest.raises(ValueError, match="format must be one of auto, fields, hh_rlhf"):
        PromptSource(path="p.jsonl", format="csv")
    with pytest.raises(ValueError, match="a prompt source takes a path"):
        PromptSource()


def test_a_hub_dataset_is_read_at_its_split_and_an_unknown_split_names_those_it_has(monkeypatch):
    calls = fake_hub(monkeypatch, {"train": [{"prompt": "t"}], "test": [{"prompt": "p0"}, {"prompt": "p1"}]})
    assert prompts_of(PromptSource(path="org/prompts", split="test")) == ["p0", "p1"]
    assert prompts_of("org/prompts") == ["t"]
    assert calls == [("org/prompts", None, "test"), ("org/prompts", None, "train")]
    with pytest.raises(
        ValueError, match=r"hub dataset 'org/prompts' split 'val': no such split; its splits: train, test"
    ):
        prompts_of(PromptSource(path="org/prompts", split="val"))


def test_the_real_datasets_library_s_unknown_split_is_named(tmp_path, monkeypatch):
    """The words the stand-in above mimics: a local dataset folder read by datasets itself, offline."""
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "prompts"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", [{"prompt": "a"}])
    write_jsonl(folder / "test.jsonl", [{"prompt": "b"}])
    assert [row.data for row in _read_hub(str(folder), split="test", subset=None)] == [{"prompt": "b"}]
    with pytest.raises(ValueError, match=r"split 'val': no such split; its splits: train, test"):
        list(_read_hub(str(folder), split="val", subset=None))


def test_prompts_given_as_a_list_become_conversations_checked_by_index():
    given = given_prompts(["Hi", [user("Tell a story")], (system("S"), user("Q"))], "OnlineGeneration")
    assert given == ["Hi", (user("Tell a story"),), (system("S"), user("Q"))]
    with pytest.raises(ValueError, match=r"OnlineGeneration: field 'prompts\[1\]\[0\]' has role 'bot'"):
        given_prompts(["Hi", [{"role": "bot", "content": "x"}]], "OnlineGeneration")
    with pytest.raises(ValueError, match=r"guard held_out: prompts is empty"):
        given_prompts([], "guard held_out")

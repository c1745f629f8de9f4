"""The shipped conversational sample (assets/data/conversational) is what its script writes."""

import importlib.util
import sys

from assets_paths import CONVERSATIONAL

FILES = ("sft.jsonl", "preferences.jsonl", "preferences_implicit.jsonl", "rankings.jsonl", "prompts.jsonl")


def test_the_shipped_sample_is_what_its_script_writes(tmp_path, monkeypatch):
    monkeypatch.setattr(
        sys, "dont_write_bytecode", True
    )  # no __pycache__ among the shipped assets (tests/test_assets.py)
    spec = importlib.util.spec_from_file_location("make_conversational", CONVERSATIONAL / "make_conversational.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(tmp_path)
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (CONVERSATIONAL / name).read_bytes(), name


def test_the_conversational_rankings_load_as_rankings_of_rendered_conversations():
    from assets_paths import STORIES260K_CHAT

    from rlhf_lit.data import PreferenceDataModule
    from rlhf_lit.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(STORIES260K_CHAT))
    dm = PreferenceDataModule(
        tokenizer=tokenizer,
        train_path=str(CONVERSATIONAL / "rankings.jsonl"),
        fields={"ranks": "ranks"},
        max_length=96,
        max_prompt_length=64,
    )
    dm.setup()
    assert dm.format == "rankings" and dm.chat_rendered
    assert dm.stats["train_records"] == 60 and dm.stats["train_dropped"] == 0
    item = dm.train_dataset[0]
    prompt = tokenizer(
        '<s>User: Continue the story: "Thank you, Ant. You are very\nAssistant:', add_special_tokens=False
    )["input_ids"]
    assert item["prompt_length"] == len(prompt) and item["rank"] == [0, 1, 2]
    for ids in item["input_ids"]:  # each response after the same rendered prompt, ending with the template's </s>
        assert ids[: len(prompt)] == prompt and ids[-1] == tokenizer.eos_token_id

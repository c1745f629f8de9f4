"""The shipped conversational sample (assets/data/conversational) is what its script writes."""

import importlib.util
import sys

from assets_paths import CONVERSATIONAL

FILES = ("sft.jsonl", "preferences.jsonl", "preferences_implicit.jsonl", "rankings.jsonl", "prompts.jsonl")


def test_the_shipped_sample_is_what_its_script_writes(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # no __pycache__ among the shipped assets (tests/test_assets.py)
    spec = importlib.util.spec_from_file_location("make_conversational", CONVERSATIONAL / "make_conversational.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(tmp_path)
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (CONVERSATIONAL / name).read_bytes(), name

"""The chat demo's prompts: first human turns, distinct, short, split by a fixed seed into disjoint parts."""

from __future__ import annotations

import gzip
import json

import pytest

from demo.chat_prompts import MAX_WORDS, first_human_turns, read_prompt_file, split_prompts, write_prompt_splits


def _write_hh(path, transcripts):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for t in transcripts:
            f.write(json.dumps({"chosen": t, "rejected": t + " no"}) + "\n")


def test_first_human_turns_are_distinct_in_file_order_and_skip_malformed(tmp_path):
    path = tmp_path / "hh.jsonl.gz"
    _write_hh(
        path,
        [
            "\n\nHuman: How do I bake bread?\n\nAssistant: Use flour.",
            "\n\nHuman: Tell me a joke.\n\nAssistant: No.\n\nHuman: Please?\n\nAssistant: Fine.",
            "\n\nHuman: How do I bake bread?\n\nAssistant: Knead it.",  # the same request again
            "\n\nAssistant: I start.",  # no human turn first: the HH reader skips it
        ],
    )
    assert first_human_turns(path) == ["How do I bake bread?", "Tell me a joke."]


def test_the_split_is_seeded_disjoint_and_leaves_out_long_requests():
    requests = [f"request number {i}" for i in range(50)] + [" ".join(["word"] * (MAX_WORDS + 1))]
    parts = split_prompts(requests, {"eval": 10, "label": 15, "ppo": None})
    assert [len(parts[p]) for p in ("eval", "label", "ppo")] == [10, 15, 25]
    everything = parts["eval"] + parts["label"] + parts["ppo"]
    assert sorted(everything) == sorted(requests[:50])  # each short request once, the long one nowhere
    assert parts == split_prompts(requests, {"eval": 10, "label": 15, "ppo": None})
    assert parts["eval"] != split_prompts(requests, {"eval": 10, "label": 15, "ppo": None}, seed=1)["eval"]
    with pytest.raises(ValueError, match="50 short requests cannot fill"):
        split_prompts(requests, {"eval": 40, "label": 15, "ppo": None})


def test_the_parts_are_written_as_one_turn_conversations(tmp_path):
    path = tmp_path / "hh.jsonl.gz"
    _write_hh(path, [f"\n\nHuman: question {i}?\n\nAssistant: answer." for i in range(6)])
    paths = write_prompt_splits(path, tmp_path / "out", {"eval": 2, "label": 2, "ppo": None})
    prompts = {part: read_prompt_file(p) for part, p in paths.items()}
    assert [len(prompts[p]) for p in ("eval", "label", "ppo")] == [2, 2, 2]
    assert all(c == [{"role": "user", "content": c[0]["content"]}] for part in prompts.values() for c in part)

"""The one writer of ``rankings`` records (rlhf_lit/data/rankings.py), shared by ``rlhf-lit iterate``'s labels and
the demo's labelling: which responses a ranking keeps, the order and dense ranks by score, the record, and that the
format's reader reads what it writes."""

from __future__ import annotations

import json

import pytest

from rlhf_lit.data.example import AdapterOptions, Fields
from rlhf_lit.data.rankings import (
    RANKS_FIELD,
    count_ranked_pairs,
    dense_ranks,
    distinct_responses,
    order_by_scores,
    ranking_record,
    rankings,
)
from rlhf_lit.data.records import read_rows


def test_dense_ranks_are_dense_and_need_sorted_scores():
    assert dense_ranks([0.5, 0.5, 0.5]) == [0, 0, 0]
    assert dense_ranks([0.9, 0.1, 0.1, -0.2, -0.2]) == [0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="sorted best first"):
        dense_ranks([0.1, 0.3])


def test_order_by_scores_by_hand_with_a_tie():
    # scores 0.2, 0.9, -0.4, 0.2 -> sample 1 (0.9), then 0 and 3 (0.2, tied, in sample order), then 2 (-0.4).
    assert order_by_scores([0.2, 0.9, -0.4, 0.2]) == ([1, 0, 3, 2], [0, 1, 1, 2])


def test_a_ranking_keeps_each_non_blank_text_once():
    # "" and " " are blank; the second "b" repeats the first.
    assert distinct_responses(["a", "", "b", " ", "b", "c"]) == [0, 2, 5]


def test_the_record_and_its_pairs():
    record = ranking_record("Hi", ["x", "y", "z"], [2, 0, 1], [0, 1, 1], [0.1, 0.2, 0.9])
    assert record == {"prompt": "Hi", "responses": ["z", "x", "y"], RANKS_FIELD: [0, 1, 1], "scores": [0.9, 0.1, 0.2]}
    assert "scores" not in ranking_record("Hi", ["x", "y"], [0, 1], [0, 1], None)
    assert count_ranked_pairs([0, 1, 1]) == 2  # z > x, z > y; x = y is no pair
    assert count_ranked_pairs([0, 1, 2]) == 3


def test_the_reader_reads_what_the_writer_writes(tmp_path):
    """A written record, strings or a conversation, comes back through the ``rankings`` adapter (the data modules'
    reader) with its order and ties."""
    conversation = ({"role": "user", "content": "Hi"},)
    options = AdapterOptions(fields=Fields(ranks=RANKS_FIELD), prompt_words=0)
    for prompt, responses in (
        ("Once upon a", [" time", " dog", " cat"]),
        (conversation, [({"role": "assistant", "content": r},) for r in ("Hello", "Go", "Yes")]),
    ):
        record = ranking_record(prompt, responses, [1, 0, 2], [0, 1, 1], [0.5, 0.7, 0.1])
        path = tmp_path / "r.jsonl"
        path.write_text(json.dumps(record) + "\n", encoding="utf-8")
        (row,) = read_rows(str(path))
        example = rankings(row, "preference", options)
        assert example.prompt == prompt
        assert list(example.responses) == [responses[1], responses[0], responses[2]]
        assert list(example.ranks) == [0, 1, 1]

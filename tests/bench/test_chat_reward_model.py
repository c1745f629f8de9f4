"""bench/chat_reward_model.py: its held-out accuracy counts the untied pairs of each ranking as the judge
ordered them, with the standard error over requests, both checked against figures derived by hand."""

from __future__ import annotations

import argparse
import json
import math
import sys

import pytest
from assets_paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import chat_reward_model  # noqa: E402


class FixedScores:
    """Stands in for the reward model: each reply's score is given in the test."""

    SCORES = {"a": 3.0, "b": 2.0, "c": 1.0, "x": 0.0, "y": 1.0, "z": 2.0}

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, prompts, responses):
        return [self.SCORES[r] for r in responses]


def test_accuracy_is_over_untied_pairs_and_its_error_over_requests(tmp_path, monkeypatch):
    import rlhf_lit.evaluation.reward_judge as reward_judge

    monkeypatch.setattr(reward_judge, "RewardModelScorer", FixedScores)
    rankings = tmp_path / "val.jsonl"
    records = [
        {"prompt": [{"role": "user", "content": "p"}], "responses": ["a", "b", "c"], "ranks": [0, 1, 2]},
        # y and z tie: the pairs are (x, y) and (x, z), both ordered against the judge
        {"prompt": [{"role": "user", "content": "q"}], "responses": ["x", "y", "z"], "ranks": [0, 1, 1]},
    ]
    rankings.write_text("".join(json.dumps(r) + "\n" for r in records))
    accuracy, se, pairs = chat_reward_model.held_out_accuracy(tmp_path / "export", rankings)
    assert pairs == 5
    assert accuracy == pytest.approx(3 / 5)
    # per-request accuracies 1 and 0: mean 0.5, sample variance 0.5, over 2 requests
    assert se == pytest.approx(math.sqrt(0.5 / 2))


def test_a_variant_is_a_name_and_its_fit_options():
    assert chat_reward_model.parse_variant("shipped=") == ("shipped", [])
    assert chat_reward_model.parse_variant("lr=--model.init_args.optimizer.lr 3e-4") == (
        "lr",
        ["--model.init_args.optimizer.lr", "3e-4"],
    )
    with pytest.raises(argparse.ArgumentTypeError, match="expected NAME=OPTIONS"):
        chat_reward_model.parse_variant("no-equals-sign")


def test_a_result_never_overwrites_an_earlier_run_of_the_day(tmp_path, monkeypatch):
    import results_file

    monkeypatch.setattr(results_file, "RESULTS", tmp_path)
    first = results_file.new_result_path("x", "2026-12-02")
    assert first == tmp_path / "x-20261202.json"
    first.write_text("{}")
    second = results_file.new_result_path("x", "2026-12-02")
    assert second == tmp_path / "x-20261202-2.json"
    second.write_text("{}")
    assert results_file.new_result_path("x", "2026-12-02") == tmp_path / "x-20261202-3.json"

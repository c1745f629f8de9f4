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
    scored = chat_reward_model.scored_rankings(tmp_path / "export", rankings)
    accuracy, se, pairs = chat_reward_model.held_out_accuracy(scored)
    assert pairs == 5
    assert accuracy == pytest.approx(3 / 5)
    # per-request accuracies 1 and 0: mean 0.5, sample variance 0.5, over 2 requests
    assert se == pytest.approx(math.sqrt(0.5 / 2))


def test_accuracy_by_margin_buckets_each_pair_by_the_judges_difference():
    # the judge's scores in the record, the reward model's beside it; every pair worked by hand
    record = {"ranks": [0, 1, 2, 3], "scores": [0.9, 0.85, 0.4, 0.0]}
    rm = [2.0, 1.0, 3.0, -1.0]
    by = chat_reward_model.accuracy_by_margin([(record, rm)])
    # margins: (0,1) .05, (0,2) .5, (0,3) .9, (1,2) .45, (1,3) .85, (2,3) .4
    assert by["<0.1"] == {"pairs": 1, "accuracy": 1.0}
    assert by["0.1-0.3"]["pairs"] == 0
    assert by["0.3-0.6"] == {"pairs": 3, "accuracy": pytest.approx(1 / 3)}  # (0,2) wrong, (1,2) wrong, (2,3) right
    assert by[">=0.6"] == {"pairs": 2, "accuracy": 1.0}  # (0,3), (1,3)


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


def test_labels_from_an_earlier_run_are_copied_into_the_new_folder_and_counted(tmp_path):
    source = tmp_path / "earlier"
    (source / "data").mkdir(parents=True)
    (source / "data" / "train.rankings.jsonl").write_text('{"a": 1}\n{"a": 2}\n{"a": 3}\n')
    (source / "data" / "val.rankings.jsonl").write_text('{"a": 4}\n\n')
    train, val, labels = chat_reward_model.reused_labels(source, tmp_path / "new")
    assert train == tmp_path / "new" / "data" / "train.rankings.jsonl"
    assert train.read_text() == (source / "data" / "train.rankings.jsonl").read_text()
    assert val.read_text() == '{"a": 4}\n\n'
    assert labels == {"labels_from": str(source), "label_prompts": 3, "val_prompts": 1}


def test_labels_from_a_folder_without_rankings_is_refused_by_name(tmp_path):
    (tmp_path / "earlier" / "data").mkdir(parents=True)
    with pytest.raises(SystemExit, match="no data/train.rankings.jsonl"):
        chat_reward_model.reused_labels(tmp_path / "earlier", tmp_path / "new")

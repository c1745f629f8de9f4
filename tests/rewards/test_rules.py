"""Rule rewards (rlhf_lit.rewards.rules) by hand."""

from __future__ import annotations

import pytest

from rlhf_lit.rewards import RewardBatch, load_reward_function
from rlhf_lit.rewards.rules import count_word, mentions_ground_truth


def _batch(responses: list[str], names: list[str]) -> RewardBatch:
    n = len(responses)
    return RewardBatch(
        prompts=["p"] * n, responses=responses, response_ids=[[1]] * n, ended=[True] * n, extras={"ground_truth": names}
    )


def test_count_word_counts_whole_words_only():
    # "Lily" twice (once before a period, once before 's); "Lilyanne" and "lily" (lower case) do not count.
    assert count_word("Lily saw Lilyanne. lily ran to Lily's mom.", "Lily") == 2
    assert count_word("Tim and Timmy", "Tim") == 1  # "Timmy" is another name
    assert count_word("", "Tim") == 0


def test_mentions_ground_truth_by_hand():
    batch = _batch(
        [" She smiled at Lily.", " He went home.", " Timmy played.", " Max, Max, run!"], ["Lily", "Tom", "Tim", "Max"]
    )
    # 1: "Lily." whole word -> 1; 2: no "Tom" -> 0; 3: "Timmy" is not "Tim" -> 0; 4: "Max" twice -> 1.
    assert mentions_ground_truth(batch) == [1.0, 0.0, 0.0, 1.0]
    # min_count 2: only the fourth response names its character twice.
    assert mentions_ground_truth(batch, min_count=2) == [0.0, 0.0, 0.0, 1.0]


def test_mentions_ground_truth_loads_by_spec_with_kwargs():
    fn = load_reward_function("rlhf_lit.rewards.rules:mentions_ground_truth", {"min_count": 1}, "mentions")
    scores = fn(_batch([" Lily ran.", " no one"], ["Lily", "Lily"]))
    assert scores["mentions"].tolist() == [1.0, 0.0]


def test_mentions_ground_truth_refuses_a_missing_column_and_bad_values():
    batch = RewardBatch(prompts=["p"], responses=["r"], response_ids=[[1]], ended=[True])
    with pytest.raises(ValueError, match="extra_fields"):
        mentions_ground_truth(batch)
    with pytest.raises(ValueError, match="non-empty string"):
        mentions_ground_truth(_batch(["r"], [""]))
    with pytest.raises(ValueError, match="min_count"):
        mentions_ground_truth(_batch(["r"], ["Lily"]), min_count=0)


def test_a_judge_becomes_a_reward_only_as_a_configured_source():
    # rlhf_lit.evaluation.judges:length is not assumed; a judge of this module: characters per response.
    fn = load_reward_function("rlhf_lit.rewards.rules:judge_score", {"judge": "test_rules:characters"}, "chars")
    scores = fn(_batch([" ab", " abcd", ""], ["x", "x", "x"]))
    assert scores["chars"].tolist() == [3.0, 5.0, 0.0]
    with pytest.raises(ValueError, match="judge spec 'nope' is not of the form"):
        load_reward_function("rlhf_lit.rewards.rules:judge_score", {"judge": "nope"}, "bad")(_batch([" a"], ["x"]))


def characters(texts: list[str]) -> list[float]:
    """A judge for the test above: the length of each text in characters."""
    return [float(len(t)) for t in texts]

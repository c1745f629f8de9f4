"""bench/chat_kl_optimum.py: the reward-tilted policy over drawn replies, by hand."""

from __future__ import annotations

import json
import math
import sys

import pytest
from assets_paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from chat_kl_optimum import evaluated_policies, optimum_at, paired_gain, summarise, tilted_frontier  # noqa: E402

# Request 0: rm 0 and ln 3, judge 0 and 1: at beta 1 the weights are 1/4 and 3/4. Request 1: two equal
# scores, weights 1/2 and 1/2 whatever beta, KL 0, judge 0.5.
SAMPLES = [
    {"prompt_index": 0, "rm": 0.0, "judge": 0.0},
    {"prompt_index": 0, "rm": math.log(3.0), "judge": 1.0},
    {"prompt_index": 1, "rm": 2.0, "judge": 0.2},
    {"prompt_index": 1, "rm": 2.0, "judge": 0.8},
]


def test_the_tilt_at_beta_one_by_hand():
    frontier = tilted_frontier(SAMPLES, betas=[1.0])
    assert frontier["replies_per_request"] == 2
    assert frontier["base"] == {"judge": pytest.approx(0.5), "rm": pytest.approx((math.log(3) + 4) / 4)}
    (point,) = frontier["points"]
    kl0 = 0.25 * math.log(2 * 0.25) + 0.75 * math.log(2 * 0.75)  # sum w log(N w), N = 2
    assert point["kl"] == pytest.approx(kl0 / 2)  # request 1 adds KL 0
    assert point["judge"] == pytest.approx((0.75 + 0.5) / 2)
    assert point["rm"] == pytest.approx((0.75 * math.log(3) + 2.0) / 2)


def test_a_cold_tilt_is_the_best_reply_and_a_hot_one_the_draw():
    hot, cold = tilted_frontier(SAMPLES, betas=[1e6, 1e-3])["points"]
    assert hot["kl"] == pytest.approx(0.0, abs=1e-9) and hot["judge"] == pytest.approx(0.5)
    assert cold["kl"] == pytest.approx(math.log(2) / 2) and cold["judge"] == pytest.approx((1.0 + 0.5) / 2)


def test_optimum_at_interpolates_the_gain_from_the_origin_and_stops_at_the_curve_end():
    frontier = {"base": {"judge": 0.5}, "points": [{"kl": 0.2, "judge": 0.6}, {"kl": 0.4, "judge": 0.8}]}
    assert optimum_at(frontier, 0.1) == pytest.approx(0.05)
    assert optimum_at(frontier, 0.3) == pytest.approx(0.2)
    assert optimum_at(frontier, 0.5) is None


def test_evaluated_policies_are_paired_gains_over_the_instruction_model(tmp_path):
    (tmp_path / "eval").mkdir()
    _eval_file(tmp_path, "instruction", 0.0, [0.2, 0.4])
    _eval_file(tmp_path, "ppo", 2.0, [0.5, 0.5])
    _eval_file(tmp_path, "dpo_beta_0.1", 0.3, [0.4, 0.4])
    rows = evaluated_policies(tmp_path, reward_model=None)
    assert [r["policy"] for r in rows] == ["dpo_beta_0.1", "ppo"]
    assert rows[0]["judge_gain"] == pytest.approx(0.1) and rows[0]["judge_gain_se"] == pytest.approx(0.1)
    assert rows[1]["kl"] == 2.0 and rows[1]["judge_gain"] == pytest.approx(0.2) and "rm_gain" not in rows[1]


def test_unequal_draws_weigh_each_request_alike_and_use_its_own_count():
    # Request 0 as above (2 replies); request 1 has 4 equal scores: KL 0 at any beta, judge 0.25 either way.
    samples = SAMPLES[:2] + [{"prompt_index": 1, "rm": 1.0, "judge": j} for j in (0.0, 0.0, 0.0, 1.0)]
    frontier = tilted_frontier(samples, betas=[1.0])
    assert frontier["replies_per_request"] == 2
    assert frontier["base"]["judge"] == pytest.approx((0.5 + 0.25) / 2)  # a mean of request means, not of 6 replies
    (point,) = frontier["points"]
    assert point["kl"] == pytest.approx((0.25 * math.log(0.5) + 0.75 * math.log(1.5)) / 2)


def test_paired_gain_by_hand():
    mean, se = paired_gain([1.0, 2.0, 4.0], [0.0, 1.0, 1.0])  # differences 1, 1, 3
    assert mean == pytest.approx(5 / 3)
    assert se == pytest.approx(math.sqrt(((1 - 5 / 3) ** 2 * 2 + (3 - 5 / 3) ** 2) / 2 / 3))


def _eval_file(folder, name, kl, judges):
    samples = [{"prompt_index": i, "judge": j, "prompt_text": "p", "response": "r"} for i, j in enumerate(judges)]
    (folder / "eval" / f"{name}.json").write_text(json.dumps({"metrics": {"kl_mean": kl}, "samples": samples}))


def test_summarise_sets_each_policy_against_the_optimum_at_its_kl(tmp_path):
    (tmp_path / "eval").mkdir()
    (tmp_path / "best_of_n").mkdir()
    (tmp_path / "best_of_n" / "best_of_n.json").write_text(json.dumps({"samples": SAMPLES, "prompt_texts": ["a", "b"]}))
    _eval_file(tmp_path, "instruction", 0.0, [0.1, 0.3])
    # DPO's KL is the tilt's at beta 1 (one of the curve's points): there request 0's weights are 1/4 and 3/4,
    # so the optimum's judge gain is (0.75 - 0.5) / 2 (request 1's replies score alike and stay put).
    kl_beta_1 = (0.25 * math.log(0.5) + 0.75 * math.log(1.5)) / 2
    _eval_file(tmp_path, "dpo_beta_0.1", kl_beta_1, [0.2, 0.3])  # gains 0.1 and 0: mean 0.05, se 0.05
    _eval_file(tmp_path, "ppo", 9.0, [0.9, 0.9])  # beyond the curve (at most log 2 / 2 nats)
    run = summarise(tmp_path, draw=None, rescore=False)
    dpo, ppo = run["policies"]
    assert dpo["judge_gain"] == pytest.approx(0.05) and dpo["judge_gain_se"] == pytest.approx(0.05)
    assert dpo["optimum_gain"] == pytest.approx(0.125)
    assert dpo["share"] == pytest.approx(0.4) and dpo["share_se"] == pytest.approx(0.4)
    assert ppo["optimum_gain"] is None and ppo["share"] is None and "rm_gain" not in ppo

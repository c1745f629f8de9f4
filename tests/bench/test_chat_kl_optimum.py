"""bench/chat_kl_optimum.py: the reward-tilted policy over drawn replies, by hand."""

from __future__ import annotations

import json
import math
import sys

import pytest
from assets_paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from chat_kl_optimum import evaluated_policies, optimum_at, tilted_frontier  # noqa: E402

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


def test_evaluated_policies_are_gains_over_the_instruction_model(tmp_path):
    (tmp_path / "eval").mkdir()
    for name, judge, kl in (("instruction", 0.2, 0.0), ("ppo", 0.5, 2.0), ("dpo_beta_0.1", 0.35, 0.3)):
        (tmp_path / "eval" / f"{name}.json").write_text(json.dumps({"metrics": {"judge_mean": judge, "kl_mean": kl}}))
    rows = evaluated_policies(tmp_path, reward_model=None)
    assert [r["policy"] for r in rows] == ["dpo_beta_0.1", "ppo"]
    assert rows[0]["judge_gain"] == pytest.approx(0.15) and rows[1]["kl"] == 2.0 and "rm_gain" not in rows[1]

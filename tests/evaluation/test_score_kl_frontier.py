"""The score-against-KL frontier of the library (:mod:`rlhf_lit.evaluation.frontier`): points from evaluation
results and best-of-N sweeps, computed by hand."""

from __future__ import annotations

import math

import pytest

from rlhf_lit.evaluation.frontier import FrontierPoint, frontier_table, point_from_evaluation, points_from_best_of_n


def test_point_from_evaluation_mean_kl_and_standard_error():
    # judges 0, 1, 1, 0: mean 0.5; sample variance (4 x 0.25) / 3 = 1/3; s.e. = sqrt(1/3 / 4) = 0.288675...
    # kls 2, 4, 0, 6: mean 3
    samples = [{"judge": j, "kl": k} for j, k in ((0.0, 2.0), (1.0, 4.0), (1.0, 0.0), (0.0, 6.0))]
    point = point_from_evaluation({"samples": samples}, "PPO", "rollout 10")
    assert point == FrontierPoint(
        "PPO", "rollout 10", kl=3.0, score=0.5, score_se=pytest.approx(math.sqrt(1 / 12)), n=4
    )
    assert point.score_se == pytest.approx(0.28867513459)
    with pytest.raises(ValueError, match="no samples"):
        point_from_evaluation({"samples": []}, "PPO", "x")


def test_points_from_best_of_n_use_the_analytic_kl_and_the_prompt_count():
    result = {
        "config": {"num_samples": 64, "num_prompts": 128},
        "rows": [
            {"n": 1, "kl_analytic": 0.0, "judge_mean": 0.3, "judge_stderr": 0.02},
            {"n": 4, "kl_analytic": math.log(4) - 0.75, "judge_mean": 0.6, "judge_stderr": 0.01},
        ],
    }
    points = points_from_best_of_n(result)
    assert [(p.setting, p.kl, p.score, p.score_se, p.n, p.kl_analytic) for p in points] == [
        ("N 1", 0.0, 0.3, 0.02, 128, True),
        ("N 4", math.log(4) - 0.75, 0.6, 0.01, 128, True),
    ]
    assert "64 samples per prompt" in points[0].note
    result["rows"][0]["judge_mean"] = None
    with pytest.raises(ValueError, match="--judge"):
        points_from_best_of_n(result)


def test_the_rm_score_frontier_and_what_an_evaluation_must_hold():
    samples = [{"rm": 1.0, "kl": 1.0}, {"rm": 3.0, "kl": 2.0}]
    point = point_from_evaluation({"samples": samples}, "PPO", "rollout 5", score="rm")
    assert (point.kl, point.score, point.score_se, point.n) == (1.5, 2.0, pytest.approx(1.0), 2)
    with pytest.raises(ValueError, match="no 'judge' per sample .evaluate with --judge."):
        point_from_evaluation({"samples": samples}, "PPO", "x")
    with pytest.raises(ValueError, match="no 'kl' per sample .evaluate with --reference."):
        point_from_evaluation({"samples": [{"rm": 1.0}]}, "PPO", "x", score="rm")
    bon = {
        "config": {"num_samples": 8, "num_prompts": 4, "estimator": "first_n"},
        "rows": [
            {
                "n": 2,
                "kl_analytic": math.log(2) - 0.5,
                "judge_mean": None,
                "judge_stderr": None,
                "rm_mean": 0.7,
                "rm_stderr": 0.1,
            }
        ],
    }
    (best,) = points_from_best_of_n(bon, score="rm")
    assert (best.score, best.score_se, best.n, best.note) == (0.7, 0.1, 4, "8 samples per prompt, first N")
    table = frontier_table([point, best], score_label="RM score", reference="the base model")
    assert table[0] == "| method | setting | KL to the base model (nats) | RM score +- s.e. | n | note |"
    assert table[2] == "| PPO | rollout 5 | 1.50 | 2.000 +- 1.000 | 2 |  |"

"""``python -m demo iterate``: its loop configs, its noisy labeller and its table (no run: a smoke run is by hand)."""

from __future__ import annotations

import pytest

from demo.iterate_study import NOISE, build_parser, loop_config, markdown, noisy_vader, summarise


def test_the_noisy_labeller_is_the_judge_plus_noise_fixed_per_text():
    from rlhf_lit.evaluation.judges import vader

    texts = ["The dog was very happy.", "The dog was sad.", "The dog was very happy."]
    noisy = noisy_vader(texts)
    assert noisy[0] == noisy[2] and noisy != vader(texts)  # the same text, the same score; not the judge's
    assert all(abs(n - v) < 5 * NOISE for n, v in zip(noisy, vader(texts)))


def test_the_two_runs_have_equal_policy_compute(tmp_path):
    args = build_parser().parse_args(["--out", str(tmp_path), "--iterations", "3", "--rollouts", "20"])
    iterated = loop_config(args, 1, tmp_path / "iterated", 3, 20)
    single = loop_config(args, 1, tmp_path / "single", 1, 60)
    assert (iterated["iterations"], single["iterations"]) == (3, 1)
    rollouts = [
        c["ppo"]["options"][c["ppo"]["options"].index("--model.init_args.max_rollouts") + 1] for c in (iterated, single)
    ]
    assert 3 * int(rollouts[0]) == int(rollouts[1])
    assert iterated["labeler"]["source"] == "demo.iterate_study:noisy_vader" and iterated["seed"] == 1
    assert iterated["evaluation"]["judge"] == "rlhf_lit.evaluation.judges:vader"  # gold: the judge without noise


def test_the_table_has_each_iteration_and_the_single_run_with_standard_errors():
    def rows(gold):
        return [
            {
                "iteration": t,
                "gold": g,
                "proxy": 0.5,
                "kl": 1.0,
                "length": 8.0,
                "rm_acc_before": None,
                "rm_acc_after": 0.75,
                "labelled_pairs": 12,
            }
            for t, g in enumerate(gold)
        ]

    results = [
        {"seed": 0, "iterated": rows([0.1, 0.2, 0.3]), "single": rows([0.1, 0.4])},
        {"seed": 1, "iterated": rows([0.1, 0.4, 0.5]), "single": rows([0.1, 0.2])},
    ]
    summary = summarise(results)
    assert [(r["run"], r["iteration"]) for r in summary["rows"]] == [
        ("iterated", 0),
        ("iterated", 1),
        ("iterated", 2),
        ("single", 1),
    ]
    assert summary["rows"][2]["gold"]["mean"] == pytest.approx(0.4)
    assert summary["rows"][2]["gold"]["se"] == pytest.approx(0.1)  # sample std 0.1414 / sqrt(2)
    assert summary["rows"][0]["rm_acc_before"] is None
    text = markdown(summary, {"command": "python -m demo iterate --out x"})
    assert "| iterated | 2 | 0.400 ± 0.100 |" in text and "| single | 1 |" in text

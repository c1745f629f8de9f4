"""The seeds study's arithmetic (means, standard errors, DPO at PPO's KL) and its folder rules."""

from __future__ import annotations

import argparse
import math
import subprocess

import cli_forked
import pytest
from cli_in_process import run_entry

from demo.runner import seed_overrides
from demo.seeds import MARKER, RUN_MARKER, Evaluation, Job, claim, parse_variant, plan, run_job
from demo.seeds_report import dpo_at, interpolate, markdown, mean_se, summarise


def test_mean_se_uses_the_sample_std_over_sqrt_n():
    # mean 3; squared deviations 4, 1, 0, 9 -> sample variance 14 / 3; se = sqrt(14 / 3 / 4) = sqrt(7 / 6).
    mean, se = mean_se([1.0, 2.0, 3.0, 6.0])
    assert mean == 3.0
    assert se == pytest.approx(math.sqrt(7 / 6), rel=1e-12)
    assert mean_se([0.5]) == (0.5, None)  # one seed: no standard error
    with pytest.raises(ValueError):
        mean_se([])


def test_interpolate_is_piecewise_linear_and_never_extrapolates():
    points = [(4.0, 0.8), (0.0, 0.3), (2.0, 0.7)]  # any order
    assert interpolate(points, 1.0) == pytest.approx(0.5)  # halfway 0.3 -> 0.7
    assert interpolate(points, 3.0) == pytest.approx(0.75)  # halfway 0.7 -> 0.8
    assert interpolate(points, 0.0) == pytest.approx(0.3)
    assert interpolate(points, 4.0) == pytest.approx(0.8)
    assert interpolate(points, 4.5) is None and interpolate(points, -0.1) is None
    assert interpolate([], 1.0) is None


def test_dpo_at_starts_the_curve_at_sft():
    dpo = [(5.0, 0.76), (2.0, 0.7)]
    assert dpo_at(dpo, 0.28, 1.0) == pytest.approx(0.28 + (0.7 - 0.28) * 0.5)  # SFT (0, 0.28) -> (2, 0.7)
    assert dpo_at(dpo, 0.28, 3.5) == pytest.approx(0.73)  # halfway (2, 0.7) -> (5, 0.76)
    assert dpo_at(dpo, 0.28, 6.0) is None  # beyond DPO's largest KL


def _ppo(seed: int, objective: list[float], judge: float, kl: float, d2: float) -> dict:
    metrics = {"judge_mean": judge, "kl_mean": kl, "distinct_2": d2, "length_mean": 40.0, "ended_fraction": 0.1}
    early = {"judge_mean": 0.5, "kl_mean": kl / 2, "distinct_2": 0.7, "length_mean": 40.0, "ended_fraction": 0.1}
    return {
        "method": "ppo",
        "name": "v",
        "seed": seed,
        "overrides": ["--x", "1"],
        "curves": {"objective/rlhf_reward": objective, "objective/scores": objective, "objective/kl": objective},
        "evaluations": {"5": early, "10": metrics},
    }


def _dpo(seed: int, beta: str, judge: float, kl: float) -> dict:
    metrics = {"judge_mean": judge, "kl_mean": kl, "distinct_2": 0.7, "length_mean": 46.0, "ended_fraction": 0.1}
    return {
        "method": "dpo",
        "name": f"beta_{beta}",
        "seed": seed,
        "overrides": [],
        "curves": {},
        "evaluations": {"final": metrics},
    }


def test_summarise_compares_each_ppo_seed_with_dpo_of_the_same_seed():
    sft = {"judge_mean": 0.3, "kl_mean": 0.0, "distinct_2": 0.8, "length_mean": 46.0, "ended_fraction": 0.1}
    results = [
        # Seed 0: objective over 10 rollouts, first five average 0, last five 1 -> rise 1.
        _ppo(0, [0, 0, 0, 0, 0, 1, 1, 1, 1, 1], judge=0.7, kl=2.0, d2=0.72),
        # Seed 1: first five 0.2, last five 0.4 -> rise 0.2.
        _ppo(1, [0.2] * 5 + [0.4] * 5, judge=0.6, kl=3.0, d2=0.64),
        _dpo(0, "0.3", judge=0.66, kl=2.2),
        _dpo(0, "0.1", judge=0.72, kl=5.0),
        _dpo(1, "0.3", judge=0.62, kl=2.0),
        _dpo(1, "0.1", judge=0.70, kl=6.0),
    ]
    summary = summarise(results, sft)
    rows = summary["ppo"]["v"]["seeds"]
    assert [r["seed"] for r in rows] == [0, 1]
    assert rows[0]["objective_rise"] == pytest.approx(1.0) and rows[1]["objective_rise"] == pytest.approx(0.2)
    # Seed 0 at KL 2.0: on SFT (0, 0.3) -> (2.2, 0.66): 0.3 + 0.36 * 2 / 2.2.
    assert rows[0]["dpo_judge_at_kl"] == pytest.approx(0.3 + 0.36 * 2.0 / 2.2)
    # Seed 1 at KL 3.0: on (2.0, 0.62) -> (6.0, 0.70): 0.62 + 0.08 / 4.
    assert rows[1]["dpo_judge_at_kl"] == pytest.approx(0.64)
    assert rows[1]["judge_minus_dpo"] == pytest.approx(0.6 - 0.64)
    assert rows[0]["judge_gain"] == pytest.approx(0.4) and rows[1]["distinct_2_ratio"] == pytest.approx(0.8)
    mean = summary["ppo"]["v"]["mean"]
    assert mean["judge_mean"]["mean"] == pytest.approx(0.65)
    assert mean["judge_mean"]["se"] == pytest.approx(0.05)  # sample std 0.0707 / sqrt(2)
    assert mean["objective_rise"]["mean"] == pytest.approx(0.6)
    # Checkpoints along training, averaged over seeds; DPO per beta over seeds.
    assert list(summary["ppo"]["v"]["checkpoints"]) == ["5", "10"]
    assert summary["ppo"]["v"]["checkpoints"]["10"]["kl_mean"]["mean"] == pytest.approx(2.5)
    assert summary["dpo"]["beta_0.1"]["kl_mean"]["mean"] == pytest.approx(5.5)
    text = "\n".join(markdown(summary))
    assert "| 0 | +0.000 | +1.000 | +1.000 | 0.700 | 2.00 |" in text and "## DPO" in text


def test_summarise_compares_each_ppo_evaluation_with_best_of_n_at_its_kl():
    sft = {"judge_mean": 0.3, "kl_mean": 0.0, "distinct_2": 0.8, "length_mean": 46.0, "ended_fraction": 0.1}
    results = [_ppo(0, [0.0] * 10, judge=0.7, kl=2.0, d2=0.72), _ppo(1, [0.0] * 10, judge=0.6, kl=3.0, d2=0.64)]
    # N = 1, 4, 16: KL log N - (N - 1) / N
    bon = {
        "rows": [
            {"n": 1, "kl_analytic": 0.0, "judge_mean": 0.31},
            {"n": 4, "kl_analytic": 0.6363, "judge_mean": 0.65},
            {"n": 16, "kl_analytic": 1.8351, "judge_mean": 0.82},
            {"n": 64, "kl_analytic": 3.1745, "judge_mean": None},
        ]
    }
    summary = summarise(results, sft, bon)
    rows = summary["ppo"]["v"]["seeds"]
    # Seed 0's export at KL 2.0 lies beyond N = 16 (the last N with a judge score): no comparison.
    assert "bon_judge_at_kl" not in rows[0] and "judge_minus_bon" not in rows[1]
    # Its rollout-5 evaluation at KL 1.0: on (0.6363, 0.65) -> (1.8351, 0.82).
    early = 0.65 + 0.17 * (1.0 - 0.6363) / (1.8351 - 0.6363)
    checkpoint = summary["ppo"]["v"]["checkpoints"]["5"]["judge_minus_bon"]
    # Seed 1's rollout 5 at KL 1.5: on the same segment.
    early_1 = 0.65 + 0.17 * (1.5 - 0.6363) / (1.8351 - 0.6363)
    assert checkpoint["mean"] == pytest.approx(((0.5 - early) + (0.5 - early_1)) / 2) and checkpoint["n"] == 2
    assert "minus best-of-N" in "\n".join(markdown(summary))


def test_variants_seeds_and_the_folder_rule(tmp_path):
    assert parse_variant("default") == ("default", ())
    assert parse_variant("fast=--model.init_args.optimizer.lr 1e-4 --x 'a b'") == (
        "fast",
        ("--model.init_args.optimizer.lr", "1e-4", "--x", "a b"),
    )
    for bad in ("", "=--x 1", "a/b", "dpo", "..", ".hidden", "a b"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_variant(bad)
    # PPO's run is decided by rollout_seed and data.seed, DPO's by data.seed.
    assert seed_overrides(3, rollouts=True) == [
        "--seed_everything",
        "3",
        "--data.init_args.seed",
        "3",
        "--model.init_args.rollout_seed",
        "3",
    ]
    assert seed_overrides(3, rollouts=False) == ["--seed_everything", "3", "--data.init_args.seed", "3"]
    jobs = plan(tmp_path, [0, 1], [("a", ())], [0.1])
    assert [(j.method, j.name, j.seed, j.dir.relative_to(tmp_path).as_posix()) for j in jobs] == [
        ("ppo", "a", 0, "a/seed_0"),
        ("ppo", "a", 1, "a/seed_1"),
        ("dpo", "beta_0.1", 0, "dpo/beta_0.1/seed_0"),
        ("dpo", "beta_0.1", 1, "dpo/beta_0.1/seed_1"),
    ]

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="not written by"):
        claim(mine)
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    new = tmp_path / "new"
    claim(new)
    claim(new)  # marked: a rerun is accepted (and deletes nothing)
    assert (new / MARKER).is_file()


def test_an_unfinished_run_folder_is_cleared_only_when_this_command_started_it(tmp_path):
    job = Job("dpo", "beta_0.1", 0, ("--model.init_args.beta", "0.1"), tmp_path / "dpo" / "beta_0.1" / "seed_0")
    job.dir.mkdir(parents=True)
    (job.dir / "notes.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="not started by"):
        run_job(job, tmp_path / "no-demo", Evaluation("none.txt"), 10)
    assert [p.name for p in job.dir.iterdir()] == ["notes.txt"]  # untouched
    (job.dir / RUN_MARKER).write_text("dpo beta_0.1 seed 0\n")  # a run this command began and never finished
    with pytest.raises(RuntimeError, match="failed"):  # starts again from nothing; the fit fails on the missing demo
        run_job(job, tmp_path / "no-demo", Evaluation("none.txt"), 10)
    assert sorted(p.name for p in job.dir.iterdir()) == sorted([RUN_MARKER, "log.txt"])


def _seeds(*args: str, cwd) -> subprocess.CompletedProcess:
    """``python -m demo seeds <args>`` in a process of its own, as a user runs it (its runs forked from
    it: tests/cli_forked.py)."""
    return cli_forked.run_module("demo", "seeds", *args, cwd=cwd, timeout=300)


def _seeds_in_process(*args: str, cwd) -> subprocess.CompletedProcess:
    """The same command through its entry function in this process (output captured, state restored)."""
    from demo.__main__ import main

    return run_entry(main, "seeds", *args, cwd=cwd)


def test_the_command_refuses_a_missing_demo_and_a_foreign_out_folder_in_one_line(tmp_path):
    result = _seeds("--demo", "nowhere", "--out", "study", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: --demo nowhere has no sft/model: run `make demo` (or the pipeline with --out nowhere) first"
    )
    assert not (tmp_path / "study").exists()  # refused before anything is written
    demo = tmp_path / "demo"
    for need in ("sft/model", "reward_model/model", "data/ppo.txt", "prefs/preferences.jsonl"):
        (demo / need).parent.mkdir(parents=True, exist_ok=True)
        (demo / need).touch()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    result = _seeds_in_process("--demo", "demo", "--out", "mine", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: --out mine is not empty and was not written by `python -m demo seeds`"
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    result = _seeds_in_process("--demo", "demo", "--out", "new", "--variant", "../up", cwd=tmp_path)
    assert result.returncode == 2 and "NAME must be" in result.stderr

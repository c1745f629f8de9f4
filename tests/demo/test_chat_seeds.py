"""``python -m demo.chat_seeds``: the chat demo over seeds averages each method's held-out figures (means and
standard errors worked out by hand here), lists every floor per seed with whether it held in all of them,
reuses a seed's finished run, and refuses a --tiny run's results as a study's."""

from __future__ import annotations

import json

import pytest

from demo import chat_seeds


def outcome(judge: float, kl: float, ppo_gain_holds: bool, rm: float, minutes: float) -> dict:
    """A finished run's ``results.json``, as ``demo.chat_pipeline`` writes it (only what the study reads)."""
    base = {"judge_mean": 0.1, "kl_mean": 0.0, "distinct_2": 0.9, "length_mean": 47.0, "ended_fraction": 0.1}
    ppo = {"judge_mean": judge, "kl_mean": kl, "distinct_2": 0.8, "length_mean": 46.0, "ended_fraction": 0.08}
    return {
        "metrics": {
            "instruction model": base | {"other_turn_fraction": 0.0},
            "PPO": ppo | {"other_turn_fraction": 0.0},
        },
        "floors": {"judge_gain": {"value": judge - 0.1, "floor": 0.2, "holds": ppo_gain_holds}},
        "rm_val_accuracy": rm,
        "timings_s": {"total": minutes * 60},
        "tiny": False,
    }


def write_run(folder, result: dict) -> None:
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps(result), encoding="utf-8")


def test_the_study_averages_over_seeds_and_marks_a_floor_one_seed_fails(tmp_path):
    runs = {0: outcome(0.5, 4.0, True, 0.70, 40.0), 1: outcome(0.3, 2.0, False, 0.72, 44.0)}
    summary = chat_seeds.summarise(runs)
    ppo = summary["methods"]["PPO"]
    assert ppo["judge_mean"]["mean"] == pytest.approx(0.4)
    # two values a and b: the standard error is |a - b| / 2
    assert ppo["judge_mean"]["se"] == pytest.approx(0.1)
    assert ppo["kl_mean"]["mean"] == pytest.approx(3.0) and ppo["kl_mean"]["se"] == pytest.approx(1.0)
    assert summary["methods"]["instruction model"]["judge_mean"]["se"] == pytest.approx(0.0)
    assert summary["floors"]["judge_gain"] == {
        "0": {"value": pytest.approx(0.4), "holds": True},
        "1": {"value": pytest.approx(0.2), "holds": False},
    }
    assert summary["floors_hold_in_every_seed"] == {"judge_gain": False}
    assert summary["rm_val_accuracy"]["mean"] == pytest.approx(0.71)
    assert summary["wall_minutes"]["mean"] == pytest.approx(42.0) and summary["wall_minutes"]["se"] == pytest.approx(
        2.0
    )
    text = chat_seeds.markdown(summary)
    assert "| PPO | 0.400 ± 0.100 | 3.00 ± 1.00 |" in text
    assert "| judge_gain | 0.400 (holds) | 0.200 (FAILS) | FAILS |" in text


def test_finished_seeds_are_reused_not_run_again(tmp_path, monkeypatch):
    for seed in (0, 1):
        write_run(tmp_path / f"seed_{seed}", outcome(0.4 + seed / 10, 3.0, True, 0.71, 41.0))

    def no_run(*args):
        raise AssertionError("a finished seed was run again")

    monkeypatch.setattr(chat_seeds, "run_seed", no_run)
    assert chat_seeds.main(["--out", str(tmp_path), "--seeds", "0", "1"]) == 0
    study = json.loads((tmp_path / "study.json").read_text(encoding="utf-8"))
    assert study["seeds"] == [0, 1]
    assert study["methods"]["PPO"]["judge_mean"]["mean"] == pytest.approx(0.45)
    assert study["floors_hold_in_every_seed"]["judge_gain"] is True
    assert (tmp_path / "study.md").read_text(encoding="utf-8").startswith("# The chat demo over seeds 0, 1")


def test_a_tiny_runs_results_are_refused_as_a_study_seed(tmp_path):
    write_run(tmp_path / "seed_0", outcome(0.4, 3.0, True, 0.7, 5.0) | {"tiny": True})
    with pytest.raises(SystemExit, match="a --tiny run's results"):
        chat_seeds.main(["--out", str(tmp_path), "--seeds", "0"])


def test_a_missing_seed_runs_the_pipeline_with_that_seed(tmp_path, monkeypatch):
    calls = []

    def fake_run(cmd):
        calls.append(cmd)
        write_run(tmp_path / "seed_2", outcome(0.4, 3.0, True, 0.7, 40.0))

        class Done:
            returncode = 0

        return Done()

    monkeypatch.setattr(chat_seeds.subprocess, "run", fake_run)
    assert chat_seeds.main(["--out", str(tmp_path), "--seeds", "2", "--model", "/m", "--device", "cuda"]) == 0
    (cmd,) = calls
    seed_2 = ["-m", "demo.chat_pipeline", "--seed", "2", "--out", str(tmp_path / "seed_2")]
    assert cmd[1:] == [*seed_2, "--device", "cuda", "--model", "/m"]

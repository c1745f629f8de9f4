"""The offline demo pipeline end to end with tiny budgets (``python -m rlhf_lit.demo.pipeline --tiny``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from rlhf_lit.demo.report import read_scalars

EVAL_METRICS = ("judge_mean", "judge_std", "kl_mean", "kl_std", "distinct_1", "distinct_2",
                "length_mean", "ended_fraction", "num_samples")


def _pipeline(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    # Run from tmp_path, not the project root: the pipeline must find its configs and assets itself.
    return subprocess.run(
        [sys.executable, "-m", "rlhf_lit.demo.pipeline", *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )


@pytest.mark.slow
def test_tiny_pipeline_runs_every_stage_and_leaves_models_evals_and_report(tmp_path):
    out = tmp_path / "demo"
    result = _pipeline(tmp_path, "--tiny", "--out", str(out))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    # The three models (and the KL=0 policy) load with the plain Hugging Face classes.
    for name in ("sft", "ppo", "ppo_kl0"):
        model = AutoModelForCausalLM.from_pretrained(out / name / "model")
        assert model.config.vocab_size == 512
        assert f"[demo] {name} model: {out / name / 'model'}" in result.stdout
    rm = AutoModelForSequenceClassification.from_pretrained(out / "rm" / "model")
    assert rm.config.num_labels == 1
    assert "wall time:" in result.stdout

    # Preferences come from the RM paragraph range only (TINY budget: its first 32 prompts).
    pairs = [json.loads(line) for line in (out / "prefs" / "preferences.jsonl").read_text().splitlines()]
    assert pairs and all(1000 <= p["paragraph"] < 1032 for p in pairs)
    assert all(p["chosen_score"] > p["rejected_score"] for p in pairs)  # argmax labels

    # Evaluations on the held-out range, same prompts for every model.
    evals = {n: json.loads((out / "eval" / f"{n}.json").read_text()) for n in ("sft", "ppo", "ppo_kl0")}
    for name, ev in evals.items():
        assert set(EVAL_METRICS) <= set(ev["metrics"]), name
        assert ev["metrics"]["num_samples"] == 16
        assert [s["paragraph"] for s in ev["samples"]] == list(range(3000, 3016))
        assert ev["config"]["sampling"]["max_new_tokens"] == 16  # what the tiny PPO sampled with
    # The SFT model against itself: identical logprobs, so the KL is exactly 0.
    assert evals["sft"]["metrics"]["kl_mean"] == 0.0

    # PPO logged the judge and diversity for each of its 2 rollouts; both runs are in the report.
    for name in ("ppo", "ppo_kl0"):
        scalars = read_scalars(str(out / name / "version_0"))
        for tag in ("objective/judge", "objective/scores", "objective/kl", "diversity/distinct_2"):
            assert scalars[tag][0] == [0, 1], (name, tag)
    report = out / "report"
    for png in ("rm_score.png", "judge_score.png", "kl.png", "frontier.png"):
        assert (report / png).stat().st_size > 1000, png
    assert "PPO, KL coef 0" in (report / "report.md").read_text()
    summary = (report / "summary.md").read_text()
    assert "| ppo_kl0 |" in summary and "held-out pair accuracy" in summary

    results = json.loads((out / "results.json").read_text())
    assert 0.0 <= results["rm_val_accuracy"] <= 1.0
    assert set(results["metrics"]) == {"sft", "ppo", "ppo_kl0"}


def test_a_failing_stage_stops_the_pipeline_with_its_exit_status(tmp_path):
    out = tmp_path / "demo"
    result = _pipeline(tmp_path, "--tiny", "--out", str(out), "--base-model", str(tmp_path / "missing"))
    assert result.returncode != 0
    assert "stage 'sft' failed" in result.stderr
    assert (out / "logs" / "sft.log").exists()
    assert not (out / "prefs").exists()  # nothing after the failed stage ran

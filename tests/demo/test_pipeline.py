"""The offline demo pipeline end to end with tiny budgets (``python -m demo.pipeline --tiny``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import cli_forked
import pytest
import torch
from processes import pids_naming, signal_in_popen
from suite_env import subprocess_env
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from demo.plan import MARKER, STAGE_DIRS, claim_out
from demo.report import read_scalars
from rlhf_lit.models.checkpoint_policy import load_checkpoint_policy

EVAL_METRICS = (
    "judge_mean",
    "judge_std",
    "kl_mean",
    "kl_std",
    "distinct_1",
    "distinct_2",
    "length_mean",
    "ended_fraction",
    "num_samples",
)


def _pipeline(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m demo.pipeline <args>`` in a process of its own, its stages forked from it
    (tests/cli_forked.py). Run from tmp_path, not the project root: the pipeline must find its
    configs and assets itself."""
    return cli_forked.run_module("demo.pipeline", *args, cwd=tmp_path)


@pytest.mark.slow
def test_tiny_pipeline_runs_every_stage_and_leaves_models_evals_and_report(tmp_path):
    out = tmp_path / "demo"
    result = _pipeline(tmp_path, "--tiny", "--out", str(out))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    # The three models (and the KL=0 and DPO policies) load with the plain Hugging Face classes.
    dpo = ("dpo/beta_0.05", "dpo/beta_0.1", "dpo/beta_0.3")
    for name in ("sft", "ppo", "ppo_kl0", *dpo):
        model = AutoModelForCausalLM.from_pretrained(out / name / "model")
        assert model.config.vocab_size == 512
        assert f"[demo] {name} model: {out / name / 'model'}" in result.stdout
    rm = AutoModelForSequenceClassification.from_pretrained(out / "reward_model" / "model")
    assert rm.config.num_labels == 1
    assert "wall time:" in result.stdout

    # Preferences come from the RM paragraph range only (TINY budget: its first 32 prompts).
    pairs = [json.loads(line) for line in (out / "prefs" / "preferences.jsonl").read_text().splitlines()]
    assert pairs and all(1000 <= p["paragraph"] < 1032 for p in pairs)
    assert all(p["chosen_score"] > p["rejected_score"] for p in pairs)  # argmax labels
    # The RM config reads rankings: the judge's order of the same samples, best first.
    rankings = [json.loads(line) for line in (out / "prefs" / "rankings.jsonl").read_text().splitlines()]
    assert rankings and all(1000 <= r["paragraph"] < 1032 for r in rankings)
    assert all(
        r["scores"] == sorted(r["scores"], reverse=True) and len(r["ranks"]) == len(r["responses"]) >= 2
        for r in rankings
    )
    assert f"reward_model: {len(rankings)} judge-labelled rankings" in result.stdout

    # Evaluations on the held-out range, same prompts for every model.
    names = ("sft", "ppo", "ppo_kl0", "ppo_rollout1", *(d.replace("/", "_") for d in dpo))
    evals = {n: json.loads((out / "eval" / f"{n}.json").read_text()) for n in names}
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
    for png in ("rm_score.png", "judge_score.png", "kl.png", "training_frontier.png", "frontier.png"):
        assert (report / png).stat().st_size > 1000, png
    assert "PPO, KL coef 0" in (report / "report.md").read_text()
    summary = (report / "summary.md").read_text()
    assert "| ppo_kl0 |" in summary and "held-out pair accuracy" in summary

    # The frontier: every method on the held-out prompts, in the summary and in frontier.json.
    frontier = [(p["method"], p["setting"], p["n"]) for p in json.loads((report / "frontier.json").read_text())]
    assert frontier == [
        ("SFT", "-", 16),
        ("PPO", "rollout 1", 16),
        ("PPO", "rollout 2", 16),
        ("PPO, KL coef 0", "rollout 2", 16),
        ("DPO", "beta 0.05", 16),
        ("DPO", "beta 0.1", 16),
        ("DPO", "beta 0.3", 16),
        ("best-of-N", "N 1", 8),
        ("best-of-N", "N 2", 8),
        ("best-of-N", "N 4", 8),
    ]
    assert "![frontier](frontier.png)" in summary and "| PPO | rollout 1 |" in summary
    assert "| best-of-N | N 4 | 0.64 (analytic) |" in summary
    # The PPO point at the last rollout is the export; its checkpoint holds the same policy.
    exported = AutoModelForCausalLM.from_pretrained(out / "ppo" / "model").state_dict()
    loaded = load_checkpoint_policy(str(out / "ppo" / "checkpoints" / "rollout=2.ckpt"), str(out / "sft" / "model"))
    assert all(torch.equal(t, exported[k]) for k, t in loaded.state_dict().items())
    bon = json.loads((out / "best_of_n" / "best_of_n.json").read_text())
    assert bon["config"]["sampling"]["max_new_tokens"] == 16 and bon["config"]["num_samples"] == 4

    # `rlhf-lit evaluate` on the demo's exported models, as a user runs it: its JSON has every metric.
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"{s['prompt']}\n" for s in evals["ppo"]["samples"][:4]))
    evaluated = cli_forked.run(
        "evaluate",
        "--policy",
        str(out / "ppo" / "model"),
        "--reference",
        str(out / "sft" / "model"),
        "--reward-model",
        str(out / "reward_model" / "model"),
        "--judge",
        "rlhf_lit.evaluation.judges:vader",
        "--prompts",
        str(prompts),
        "--max-new-tokens",
        "16",
        "--out",
        str(tmp_path / "evaluate.json"),
        cwd=tmp_path,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    metrics = json.loads((tmp_path / "evaluate.json").read_text())["metrics"]
    assert metrics["num_samples"] == 4
    assert metrics["kl_mean"] != 0.0 and -1 <= metrics["judge_mean"] <= 1 and "rm_mean" in metrics

    results = json.loads((out / "results.json").read_text())
    assert 0.0 <= results["rm_val_accuracy"] <= 1.0
    assert set(results["metrics"]) == {"sft", "ppo", "ppo_kl0", *dpo}
    assert json.loads((out / MARKER).read_text())["written_by"] == "python -m demo.pipeline"


def test_a_failing_stage_stops_the_pipeline_with_its_exit_status(tmp_path):
    out = tmp_path / "demo"
    result = _pipeline(tmp_path, "--tiny", "--out", str(out), "--base-model", str(tmp_path / "missing"))
    assert result.returncode != 0
    assert "stage 'sft' failed" in result.stderr
    assert (out / "logs" / "sft.log").exists()
    assert not (out / "prefs").exists()  # nothing after the failed stage ran


def test_a_folder_the_demo_did_not_write_is_never_cleared(tmp_path):
    out = tmp_path / "mine"
    (out / "data").mkdir(parents=True)  # a user's folder that happens to share a stage folder's name
    (out / "data" / "thesis.txt").write_text("keep me")
    (out / "notes.txt").write_text("keep me too")
    result = _pipeline(tmp_path, "--tiny", "--out", str(out))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(out) in lines[0] and MARKER in lines[0], result.stderr
    assert (out / "data" / "thesis.txt").read_text() == "keep me"
    assert (out / "notes.txt").read_text() == "keep me too"
    assert sorted(p.name for p in out.iterdir()) == ["data", "notes.txt"]  # no marker, no logs: nothing written

    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    result = _pipeline(tmp_path, "--tiny", "--out", str(a_file))
    assert result.returncode == 2 and "is a file" in result.stderr and a_file.read_text() == "x"


def test_claim_out_marks_a_new_folder_and_clears_only_stage_folders_of_a_marked_one(tmp_path):
    out = tmp_path / "new" / "demo"
    claim_out(out)  # created, parents included, and marked
    assert [p.name for p in out.iterdir()] == [MARKER]
    empty = tmp_path / "empty"
    empty.mkdir()
    claim_out(empty)  # an empty folder is taken too
    assert (empty / MARKER).is_file()

    for name in STAGE_DIRS:
        (out / name / "sub").mkdir(parents=True)
    (out / "results.json").write_text("{}")
    (out / "mine.txt").write_text("keep")
    marker = (out / MARKER).read_text()
    claim_out(out)  # a rerun: stage folders and results go, the rest stays, the marker is kept
    assert sorted(p.name for p in out.iterdir()) == sorted([MARKER, "mine.txt"])
    assert (out / MARKER).read_text() == marker


def test_wait_stages_times_each_stage_to_its_own_exit_and_stops_the_rest_on_a_failure(tmp_path):
    from demo.plan import Paths
    from demo.runner import StageFailed, Timings, start_stages, wait_stages

    paths = Paths(tmp_path)
    paths.dir("logs").mkdir()

    def sleep(seconds: float, status: int = 0) -> list[str]:
        return [sys.executable, "-c", f"import sys, time; time.sleep({seconds}); sys.exit({status})"]

    timings = Timings()
    # The slow stage comes first: waiting in dict order would time the fast one at the slow one's exit.
    wait_stages(start_stages({"slow": sleep(2.0), "fast": sleep(0.0)}, paths.dir("logs")), timings)
    assert list(timings) == ["fast", "slow"]
    assert timings["fast"] < 1.5 <= timings["slow"]
    assert set(timings.cpu) == {"fast", "slow"} and all(0 < v < 1.5 for v in timings.cpu.values())

    # A background stage that ends while a foreground one runs is timed to its exit and taken out.
    timings = Timings()
    background = start_stages({"early": sleep(0.0), "late": sleep(3.0)}, paths.dir("logs"))
    wait_stages(start_stages({"fore": sleep(1.5)}, paths.dir("logs")), timings, background)
    assert list(timings) == ["early", "fore"] and timings["early"] < 1.0 and list(background) == ["late"]
    wait_stages(background, timings)
    assert list(timings) == ["early", "fore", "late"]

    started = time.perf_counter()
    running = start_stages({"long": sleep(60), "bad": sleep(0.0, status=3)}, paths.dir("logs"))
    with pytest.raises(StageFailed, match=r"stage 'bad' failed \(exit status 3\): no output; its log: ") as failure:
        wait_stages(running, Timings())
    assert failure.value.returncode == 3
    assert str(failure.value).splitlines()[1].startswith("$ ")  # the tail of its log, from its command line
    assert time.perf_counter() - started < 30  # the 60 s stage was stopped, not waited for
    assert running["long"][0].returncode is not None


def test_a_stage_that_cannot_start_stops_the_stages_started_before_it(tmp_path):
    from demo.plan import Paths
    from demo.runner import start_stages

    paths = Paths(tmp_path)
    paths.dir("logs").mkdir()
    marker = f"started-before-{os.getpid()}"
    started = time.perf_counter()
    with pytest.raises(FileNotFoundError):
        start_stages(
            {
                "first": [sys.executable, "-c", "import time; time.sleep(60)", marker],
                "second": [str(tmp_path / "none")],
            },
            paths.dir("logs"),
        )
    assert pids_naming(marker) == [] and time.perf_counter() - started < 30  # stopped, not waited for


def test_a_signal_while_a_stage_starts_stops_it(tmp_path, monkeypatch):
    from demo.plan import Paths
    from demo.runner import start_stages
    from rlhf_lit.child_runs import Stopped, stop_on_signals

    paths = Paths(tmp_path)
    paths.dir("logs").mkdir()
    marker = f"starting-when-signalled-{os.getpid()}"
    signal_in_popen(monkeypatch, signal.SIGTERM)
    with pytest.raises(Stopped), stop_on_signals("test"):
        start_stages({"first": [sys.executable, "-c", "import time; time.sleep(60)", marker]}, paths.dir("logs"))
    assert pids_naming(marker) == []


def test_an_interrupted_wait_stops_every_stage_it_waits_on(tmp_path, monkeypatch):
    import demo.runner as runner
    from demo.plan import Paths

    paths = Paths(tmp_path)
    paths.dir("logs").mkdir()
    long = [sys.executable, "-c", "import time; time.sleep(60)"]
    running = runner.start_stages({"fore": long}, paths.dir("logs"))
    background = runner.start_stages({"back": long}, paths.dir("logs"))

    class CtrlC:  # the runner's clock, whose first poll's sleep is where a terminal's Ctrl-C lands
        perf_counter = staticmethod(time.perf_counter)

        @staticmethod
        def sleep(seconds):
            raise KeyboardInterrupt

    monkeypatch.setattr(runner, "time", CtrlC)  # the runner's name only: stopping the stages waits with the real one
    started = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        runner.wait_stages(running, runner.Timings(), background)
    assert time.perf_counter() - started < 30  # stopped (SIGTERM), not waited for
    assert running["fore"][0].returncode is not None and background["back"][0].returncode is not None


def test_sigterm_stops_the_demo_and_its_running_stage(tmp_path):
    import signal

    out = tmp_path / "demo"
    log = out / "logs" / "sft.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "demo.pipeline", "--tiny", "--out", str(out)],
        cwd=tmp_path,
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (log.exists() and [p for p in pids_naming(str(out)) if p != proc.pid]):
            assert proc.poll() is None and time.monotonic() < deadline, "the SFT stage never started"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM
    assert "the demo stopped by SIGTERM (its running fits too); run it again to start over" in stderr
    assert pids_naming(str(out)) == []  # no stage outlived the demo

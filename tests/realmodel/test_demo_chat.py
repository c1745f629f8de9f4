"""``python -m demo.chat_pipeline --tiny`` (``make demo-chat``'s pipeline at its smoke-test budget) end to end
on SmolLM2-135M-Instruct (a model cut to a few blocks answers with repeats or nothing, which leave no
ranking to train on): every stage runs as a user's would, and the outputs the full run
reports from are written (the split, the chat-rendered labels, the report, the frontier, per-stage times).
What the trained model answers is not asserted here: the tiny budget is a smoke test, not a result."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from assets_paths import ROOT
from suite_env import subprocess_env

pytestmark = [pytest.mark.slow, pytest.mark.realmodel]


def jsonl(path) -> list[dict]:
    # cut at line feeds only: SmolLM2's replies may hold a raw U+2028, which splitlines() would cut at
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


def test_the_tiny_chat_demo_writes_its_report_from_chat_rendered_data(smollm2_path, tmp_path, monkeypatch):
    out = tmp_path / "demo_chat"
    command = [sys.executable, "-m", "demo.chat_pipeline", "--tiny", "--model", str(smollm2_path)]
    result = subprocess.run(
        [*command, "--out", str(out), "--threads", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1500,
        env=subprocess_env(),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    # The split: held-out requests no stage trains on, every request a one-turn conversation.
    splits = {part: jsonl(out / "data" / f"{part}.jsonl") for part in ("eval", "label", "ppo")}
    held_out = {r["prompt"][0]["content"] for r in splits["eval"]}
    assert len(held_out) == 4
    for part in ("label", "ppo"):
        assert held_out.isdisjoint(r["prompt"][0]["content"] for r in splits[part])
    assert all(r["prompt"][0]["role"] == "user" and len(r["prompt"]) == 1 for part in splits.values() for r in part)

    # The labels keep the conversation: the reward model renders them in the chat template as PPO scores them.
    rankings = jsonl(out / "prefs" / "rankings.jsonl")
    assert rankings and all(r["prompt"][0]["role"] == "user" for r in rankings)
    labelled = {r["prompt"][0]["content"] for r in rankings}
    assert labelled <= {r["prompt"][0]["content"] for r in splits["label"]}

    # The report: every method beside the instruction model, with the share of replies that end their turn.
    outcome = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert outcome["tiny"] is True and outcome["rm_val_accuracy"] is not None
    assert outcome["precision"] in ("32-true", "bf16-mixed")
    assert set(outcome["metrics"]) == {"instruction model", "PPO", "DPO (0.1)"}
    for metrics in outcome["metrics"].values():
        assert 0.0 <= metrics["ended_fraction"] <= 1.0 and metrics["other_turn_fraction"] == 0.0
        assert metrics["num_samples"] == 4
    summary = (out / "report" / "summary.md").read_text(encoding="utf-8")
    for part in ("| instruction model |", "| best-of-N |", "## Floors", "## Samples", "ends its turn"):
        assert part in summary, part
    assert (out / "report" / "frontier.png").stat().st_size > 0
    for stage in ("preferences", "reward_model", "ppo", "best_of_n"):
        assert outcome["timings_s"][stage] > 0, stage

    # bench/chat_bonbon.py on the finished folder: one draw of the largest N, BoNBoN fitted at each N on the
    # best and the worst of each request's first N, evaluated on the held-out requests; the folder is read only.
    sys.path.insert(0, str(ROOT / "bench"))
    import chat_bonbon

    # PPO's checkpoints (1 GB each: the policy and the critic in float32) are not read by the bench: removed
    # so that the suite's disk peak is this test's folder less 2 GB
    for checkpoint in (out / "ppo" / "checkpoints").glob("*.ckpt"):
        checkpoint.unlink()
    written = {}
    monkeypatch.setattr(chat_bonbon, "write_result", lambda name, fields: written.update(fields))
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    argv = ["--demo", str(out), "--model", str(smollm2_path), "--out", str(tmp_path / "bonbon"), "--ns", "2,4"]
    # 40 requests: enough pairs for more optimizer steps than the config's warmup (a shorter run is refused)
    assert chat_bonbon.main([*argv, "--prompts", "40", "--threads", "1"]) == 0
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert set(written["bonbon"]) == {"2", "4"}
    for n, fitted in written["bonbon"].items():
        pairs = jsonl(tmp_path / "bonbon" / f"n_{n}" / "pairs.jsonl")
        assert pairs and all(r["n"] == int(n) and r["prompt"][0]["role"] == "user" for r in pairs)
        assert fitted["pairs"]["written"] == len(pairs) and fitted["compute"]["samples"] == 40 * int(n)
        assert fitted["metrics"]["num_samples"] == 4 and fitted["metrics"]["kl_mean"] is not None
        assert (tmp_path / "bonbon" / f"n_{n}" / "model" / "config.json").exists()

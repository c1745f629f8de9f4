"""bench/chat_dpo_betas.py: the demo's evaluations read back, and PPO against DPO at equal KL both ways, by hand."""

from __future__ import annotations

import json
import sys

import pytest
from assets_paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from chat_dpo_betas import demo_points, equal_kl, main  # noqa: E402


def write_eval(folder, name, kl, judge):
    (folder / "eval").mkdir(parents=True, exist_ok=True)
    metrics = {"kl_mean": kl, "judge_mean": judge}
    (folder / "eval" / f"{name}.json").write_text(json.dumps({"metrics": metrics}), encoding="utf-8")


def test_demo_points_put_ppo_checkpoints_in_rollout_order(tmp_path):
    write_eval(tmp_path, "instruction", 0.0, 0.2)
    write_eval(tmp_path, "ppo_rollout12", 1.5, 0.35)
    write_eval(tmp_path, "ppo_rollout4", 0.4, 0.25)
    write_eval(tmp_path, "ppo", 2.0, 0.4)
    write_eval(tmp_path, "dpo_beta_0.1", 0.5, 0.3)
    points = demo_points(tmp_path)
    assert points["instruction"] == 0.2
    assert points["ppo_curve"] == [(0.0, 0.2), (0.4, 0.25), (1.5, 0.35), (2.0, 0.4)]
    assert points["dpo"] == {"0.1": (0.5, 0.3)}


def test_equal_kl_both_ways_by_hand():
    ppo = [(0.0, 0.2), (1.0, 0.3), (2.0, 0.5)]
    # DPO 0.1 at KL 0.5: PPO's curve there 0.25, minus 0.35 = -0.10. DPO 0.03 at KL 1.5: PPO 0.40 - 0.36 = +0.04.
    # At PPO's KL 2.0 DPO's curve (0, 0.2), (0.5, 0.35), (1.5, 0.36) does not reach: None.
    dpo = {"0.1": (0.5, 0.35), "0.03": (1.5, 0.36)}
    out = equal_kl(0.2, ppo, dpo)
    assert out["ppo_curve_minus_dpo_at_dpo_kl"] == {"0.1": pytest.approx(-0.10), "0.03": pytest.approx(0.04)}
    assert out["ppo_minus_dpo_curve_at_ppo_kl"] is None
    # A DPO point beyond PPO's KL: PPO's curve does not reach it, DPO's curve at 2.0 is 0.36 + 0.5 * 0.04 = 0.38.
    out = equal_kl(0.2, ppo, {**dpo, "0.01": (2.5, 0.40)})
    assert out["ppo_curve_minus_dpo_at_dpo_kl"]["0.01"] is None
    assert out["ppo_minus_dpo_curve_at_ppo_kl"] == pytest.approx(0.5 - 0.38)


def test_an_existing_out_folder_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="exists; name a new folder"):
        main(["--demo", str(tmp_path), "--seed", "0", "--betas", "0.03", "--out", str(tmp_path)])


def test_options_reach_every_dpo_fit_after_the_demo_stage_options(tmp_path, monkeypatch):
    import argparse
    import subprocess

    import chat_dpo_betas

    demo = tmp_path / "demo"
    demo.mkdir()
    (demo / "results.json").write_text(json.dumps({"precision": "bf16-mixed"}), encoding="utf-8")
    seen = []

    def fake_run(cmd, **_):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(chat_dpo_betas.subprocess, "run", fake_run)
    args = argparse.Namespace(
        demo=demo, out=tmp_path / "out", tiny=True, seed=0, device="cpu", options="--trainer.max_epochs 3"
    )
    (tmp_path / "out").mkdir()
    with pytest.raises(SystemExit, match="DPO at beta 0.1 failed"):
        chat_dpo_betas.fit_and_evaluate(args, "some/model", 0.1)
    assert seen[0][-2:] == ["--trainer.max_epochs", "3"]
    assert seen[0][seen[0].index("--model.init_args.beta") + 1] == "0.1"

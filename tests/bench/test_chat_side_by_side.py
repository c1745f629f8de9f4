"""bench/chat_side_by_side.py: the serial arm runs its stages one after the other with the threads of a stage
alone, the side-by-side arm together with one thread each; the demo's stages are built on the run's data."""

from __future__ import annotations

import json
import sys

import pytest
from assets_paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from chat_side_by_side import demo_stages, main, run_arms  # noqa: E402

# Each fake stage writes its torch threads and when it ran, then exits.
STAGE = (
    "import json, os, sys, time; t0 = time.time(); time.sleep(0.6); "
    "json.dump({'threads': os.environ['OMP_NUM_THREADS'], 'start': t0, 'end': time.time()}, open(sys.argv[1], 'w'))"
)


def fake_stages(folder):
    folder.mkdir(parents=True, exist_ok=True)
    return {name: [sys.executable, "-c", STAGE, str(folder / f"{name}.json")] for name in ("dpo", "ppo")}


def ran(folder):
    return {name: json.loads((folder / f"{name}.json").read_text()) for name in ("dpo", "ppo")}


def test_serial_runs_one_after_the_other_and_side_by_side_together(tmp_path):
    measured = run_arms(fake_stages, tmp_path, threads_alone=2, threads_beside=1)
    serial, beside = ran(tmp_path / "serial"), ran(tmp_path / "side_by_side")
    assert {s["threads"] for s in serial.values()} == {"2"}
    assert {s["threads"] for s in beside.values()} == {"1"}
    assert serial["ppo"]["start"] >= serial["dpo"]["end"]  # one after the other
    assert beside["ppo"]["start"] < beside["dpo"]["end"] and beside["dpo"]["start"] < beside["ppo"]["end"]
    assert set(measured["serial"]["stages_s"]) == {"dpo", "ppo"}
    assert measured["serial"]["wall_s"] >= 1.2  # two sleeps of 0.6 s in a row
    expected = measured["side_by_side"]["wall_s"] / measured["serial"]["wall_s"]
    assert measured["side_by_side_over_serial"] == pytest.approx(expected)


def fake_demo(folder):
    for rel in ("prefs/pairs.jsonl", "data/ppo.jsonl", "reward_model/model/config.json"):
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text("{}\n")
    (folder / "results.json").write_text(json.dumps({"precision": "bf16-mixed"}))
    return folder


def option(cmd, name):
    return cmd[len(cmd) - 1 - cmd[::-1].index(name) + 1]  # the last value given: the one the parser keeps


def test_demo_stages_read_the_runs_data_and_are_shortened(tmp_path):
    demo = fake_demo(tmp_path / "demo")
    stages = demo_stages(demo, tmp_path / "arm", "models/smol", dpo_steps=7, ppo_rollouts=3)
    dpo, ppo = stages["dpo"], stages["ppo"]
    assert option(dpo, "--trainer.max_steps") == "7"
    assert option(ppo, "--model.init_args.max_rollouts") == "3"
    assert option(ppo, "--model.init_args.reward_model") == str((demo / "reward_model" / "model").absolute())
    assert option(dpo, "--trainer.precision") == option(ppo, "--trainer.precision") == "bf16-mixed"
    assert option(ppo, "--trainer.callbacks.every_n_rollouts") == "4"  # past the last rollout: no checkpoint
    assert (tmp_path / "arm" / "prefs" / "pairs.jsonl").exists() and (tmp_path / "arm" / "data" / "ppo.jsonl").exists()
    assert option(dpo, "--data.init_args.train_path") == str((tmp_path / "arm" / "prefs" / "pairs.jsonl").absolute())


def test_a_folder_that_is_not_a_finished_run_is_refused_by_name(tmp_path):
    demo = fake_demo(tmp_path / "demo")
    (demo / "prefs" / "pairs.jsonl").unlink()
    with pytest.raises(SystemExit, match="no prefs/pairs.jsonl"):
        main(["--demo", str(demo), "--out", str(tmp_path / "out"), "--model", "m", "--no-write"])

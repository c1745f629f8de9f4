"""bench/chat_phase_times.py: PPO's seconds per phase from a run's events (the first rollout left out), the
stages' wall times, and verl's published step in PPO's phases, all by hand."""

from __future__ import annotations

import json
import sys

import pytest
from assets_paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from chat_phase_times import main, markdown, run_times, verl_step  # noqa: E402

# Three rollouts; the first (warm-up) is left out of every mean.
PHASE_VALUES = {
    "generate": [9.0, 2.0, 4.0],  # mean of rollouts 2, 3: 3.0
    "score": [5.0, 1.0, 1.0],  # 1.0
    "train": [7.0, 0.5, 1.5],  # 1.0
    "text": [1.0, 0.0, 0.0],  # 0.0
    "tokens_per": [1.0, 300.0, 500.0],  # 400.0
}


def fake_run(folder, seconds_scale: float = 1.0):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(folder / "ppo" / "version_0"))
    for step in range(3):
        for phase, values in PHASE_VALUES.items():
            writer.add_scalar(f"time/{phase}_s", values[step] * seconds_scale, step)
    writer.close()
    timings = {"preferences": 100.0 * seconds_scale, "ppo": 50.0, "total": 300.0}
    results = {"device": "cuda", "precision": "bf16-mixed", "timings_s": timings}
    (folder / "results.json").write_text(json.dumps(results), encoding="utf-8")
    return folder


def test_phase_means_leave_out_the_first_rollout(tmp_path):
    run = run_times(fake_run(tmp_path))
    assert run["ppo_phase_s"] == pytest.approx({"generate": 3.0, "score": 1.0, "train": 1.0, "text": 0.0})
    assert run["ppo_rollout_s"] == pytest.approx(5.0)
    assert run["ppo_tokens_per_s"] == pytest.approx(400.0)
    assert run["rollouts"] == 3 and run["device"] == "cuda"
    assert run["stages_s"]["preferences"] == 100.0 and run["stages_s"]["best_of_n"] is None


def test_verl_step_in_ppo_phases_by_hand():
    verl = verl_step()
    assert verl["phase_s"]["generate"] == pytest.approx(21.470)
    assert verl["phase_s"]["score"] == pytest.approx(4.360 + 5.800 + 0.109)
    assert verl["phase_s"]["train"] == pytest.approx(15.664 + 20.314)
    assert verl["step_s"] == pytest.approx(67.717)
    assert verl["tokens_per_s"] == pytest.approx(256 * 239.133 / 67.717)
    assert sum(verl["shares"].values()) == pytest.approx(1.0)


def test_table_gives_means_and_standard_errors_over_runs(tmp_path):
    runs = [run_times(fake_run(tmp_path / "a")), run_times(fake_run(tmp_path / "b", seconds_scale=2.0))]
    table = markdown(runs, verl_step())
    # generate 3 and 6: mean 4.5, s.e. = stdev(3, 6) / sqrt(2) = 1.5; preferences 100 and 200: 150 +- 50
    assert "| generate | 4.50 ± 1.50 | 0.60 ± 0.00 | 21.5 | 0.32 |" in table
    assert "| preferences | 150.0 ± 50.0 |" in table


def test_a_run_without_two_rollouts_is_refused_by_name(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "ppo" / "version_0"))
    for phase in PHASE_VALUES:
        writer.add_scalar(f"time/{phase}_s", 1.0, 0)
    writer.close()
    (tmp_path / "results.json").write_text(json.dumps({"timings_s": {}}), encoding="utf-8")
    with pytest.raises(SystemExit, match="for 1 rollouts; at least 2"):
        main(["--demo", str(tmp_path), "--no-write"])

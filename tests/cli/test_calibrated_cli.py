"""The shipped calibrated-reward config (configs/offline/ppo_calibrated.yaml) runs 2 rollouts through
`rlhf-lit fit`, in process, and logs the calibrated reward beside the raw score."""

from __future__ import annotations

import csv
import math

from cli_helpers import ROOT, run_main, tiny_ppo_overrides

CONFIG = str(ROOT / "configs" / "offline" / "ppo_calibrated.yaml")
RUN = "runs/calibrated"


def test_the_calibrated_config_runs_and_logs_the_quantile(tmp_path, stories_rm):
    result = run_main(
        "fit",
        "--config",
        CONFIG,
        "--run_dir",
        RUN,
        *tiny_ppo_overrides(RUN),
        "--model.init_args.reward_model",
        stories_rm,
        "--model.init_args.reward.calibration_samples",
        "3",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [
        r for r in csv.DictReader(next((tmp_path / RUN / "ppo").rglob("metrics.csv")).open()) if r["reward/quantile"]
    ]
    assert len(rows) == 2  # one per rollout
    for row in rows:
        # K = 3: q in {0.5, 1, ..., 3.5} / 4; its rollout mean within those ends, the log transform below 0
        assert 0.125 <= float(row["reward/quantile"]) <= 0.875
        assert math.log(0.125) <= float(row["reward/calibrated"]) < 0
        assert float(row["time/reference_s"]) > 0 and row["objective/scores"] and row["reward/reference"]

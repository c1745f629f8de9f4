"""bench/chat_ppo_variants.py: a variant's margin over DPO is its curve (the instruction model at KL 0, then
its checkpoints by rollout) read at DPO's KL, minus DPO's judge mean, worked by hand; a folder that is not
a finished demo run is refused by name."""

from __future__ import annotations

import sys

import pytest
from assets_paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import chat_ppo_variants  # noqa: E402


def test_margin_is_the_curve_at_dpos_kl_minus_dpo():
    base = {"judge_mean": 0.1}
    # listed out of order: the curve follows the rollouts, 4 then 8
    measured = {8: {"kl_mean": 2.0, "judge_mean": 0.5}, 4: {"kl_mean": 1.0, "judge_mean": 0.3}}
    dpo = {
        "a": {"kl_mean": 0.5, "judge_mean": 0.25},  # curve at 0.5: 0.1 + 0.5 * 0.2 = 0.2
        "b": {"kl_mean": 1.5, "judge_mean": 0.3},  # curve at 1.5: 0.4
        "c": {"kl_mean": 3.0, "judge_mean": 0.3},  # beyond the curve's last KL
    }
    margins = chat_ppo_variants.against_dpo(base, measured, dpo)
    assert margins["a"] == pytest.approx(-0.05)
    assert margins["b"] == pytest.approx(0.1)
    assert margins["c"] is None


def test_a_folder_without_a_finished_run_is_refused_by_name(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "ppo.jsonl").write_text("")
    with pytest.raises(SystemExit, match=r"--demo .*: no data/eval.jsonl \(not a finished `make demo-chat` folder\)"):
        chat_ppo_variants.finished_run(tmp_path)

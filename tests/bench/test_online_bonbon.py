"""bench/online_bonbon.py: its held-out prompts are the demo's, its fresh ones come after every demo range,
its BoNBoN stage is the demo's settings with the loop's outputs, and an iteration's gap to best-of-N is its
judge minus the sweep's curve at its KL, worked by hand."""

from __future__ import annotations

import sys

import pytest
import yaml
from assets_paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import online_bonbon  # noqa: E402

from demo.story_prompts import RANGES, load_prompts, opening_words, read_paragraphs  # noqa: E402


def test_prompts_are_the_demo_s_held_out_ones_then_paragraphs_no_demo_stage_reads(tmp_path):
    import json

    held, fresh = online_bonbon.write_prompts(tmp_path / "prompts.jsonl")
    prompts = [json.loads(line)["prompt"] for line in (tmp_path / "prompts.jsonl").read_text().splitlines()]
    start, count = RANGES["eval"]
    _, demo_eval = load_prompts(str(online_bonbon.PARAGRAPHS), start, count, 8)
    assert (held, prompts[:held]) == (count, demo_eval)
    paragraphs = read_paragraphs(str(online_bonbon.PARAGRAPHS))
    # by hand: the ranges end at 3256 (eval: 3000 + 256); what follows is fresh
    assert prompts[held:] == [opening_words(p, 8) for p in paragraphs[3256:]] and fresh == len(paragraphs) - 3256


def test_the_stage_is_the_demo_s_bonbon_without_its_own_outputs(tmp_path):
    online_bonbon.stage_config(tmp_path / "stage.yaml")
    stage = yaml.safe_load((tmp_path / "stage.yaml").read_text())
    demo = yaml.safe_load((ROOT / "configs" / "demo" / "bonbon.yaml").read_text())
    assert "logger" not in stage["trainer"] and "export_dir" not in stage["model"]["init_args"]
    assert stage["model"]["init_args"]["optimizer"] == demo["model"]["init_args"]["optimizer"]
    assert stage["data"] == demo["data"]


def test_the_gap_is_the_judge_minus_best_of_n_at_the_same_kl():
    sweep = {"rows": [{"kl_analytic": 0.0, "judge_mean": 0.2}, {"kl_analytic": 1.0, "judge_mean": 0.6}]}
    rows = [
        {"iteration": 0, "gold": 0.2, "kl": -0.001},  # a sampled KL a hair below 0 reads as 0
        {"iteration": 1, "gold": 0.3, "kl": 0.5},  # best-of-N at 0.5: 0.2 + 0.5 * 0.4 = 0.4
        {"iteration": 2, "gold": 0.7, "kl": 2.0},  # beyond the sweep
    ]
    gaps = [r["minus_best_of_n"] for r in online_bonbon.below_best_of_n(rows, sweep)]
    assert gaps[0] == pytest.approx(0.0) and gaps[1] == pytest.approx(-0.1) and gaps[2] is None
    assert all(r["minus_best_of_n"] is None for r in online_bonbon.below_best_of_n(rows, None))

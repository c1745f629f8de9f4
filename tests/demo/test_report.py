"""Report: scalars from a synthetic TensorBoard log -> PNGs and a markdown summary."""

from __future__ import annotations

import json

import pytest
from torch.utils.tensorboard import SummaryWriter

from demo.__main__ import main
from demo.report import read_scalars, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_run(path, tags, steps=5):
    writer = SummaryWriter(str(path))
    for step in range(steps):
        for i, tag in enumerate(tags):
            writer.add_scalar(tag, 0.1 * step + i, step)
    writer.close()


ALL_TAGS = [
    "objective/scores",
    "objective/judge",
    "objective/kl",
    "diversity/distinct_1",
    "diversity/distinct_2",
    "response/length",
]


def _evaluation(path, responses, judges):
    samples = [
        {
            "paragraph": 3000 + i,
            "prompt": f"Prompt {i} | with pipe",
            "response": r,
            "judge": j,
            "kl": 0.0,
            "length": 8,
            "ended": False,
        }
        for i, (r, j) in enumerate(zip(responses, judges))
    ]
    metrics = {"judge_mean": sum(judges) / len(judges), "kl_mean": 0.0}
    path.write_text(json.dumps({"metrics": metrics, "samples": samples}))
    return str(path)


def test_read_scalars_last_value_of_a_step_wins(tmp_path):
    writer = SummaryWriter(str(tmp_path))
    for step, value in [(0, 1.0), (1, 2.0), (2, 3.0), (1, 5.0)]:
        writer.add_scalar("objective/kl", value, step)
    writer.close()
    assert read_scalars(str(tmp_path)) == {"objective/kl": ([0, 1, 2], [1.0, 5.0, 3.0])}


def test_read_scalars_points_to_runs_below(tmp_path):
    _write_run(tmp_path / "version_0", ["objective/kl"])
    with pytest.raises(FileNotFoundError, match="runs below it: .*version_0"):
        read_scalars(str(tmp_path))


def test_report_with_comparison_and_missing_tags(tmp_path):
    _write_run(tmp_path / "ppo", ALL_TAGS)
    # The KL=0 run logs no judge score and no diversity.
    _write_run(tmp_path / "kl0", ["objective/scores", "objective/kl", "response/length"])
    before = _evaluation(tmp_path / "before.json", ["a dog.", "it was\nsad"], [0.1, -0.4])
    after = _evaluation(tmp_path / "after.json", ["a happy dog.", "it was fun"], [0.9, 0.6])
    out = tmp_path / "report"
    assert (
        main(
            [
                "report",
                "--run",
                str(tmp_path / "ppo"),
                "--compare",
                str(tmp_path / "kl0"),
                "--out-dir",
                str(out),
                "--before",
                before,
                "--after",
                after,
            ]
        )
        == 0
    )

    for name in ["rm_score", "judge_score", "kl", "training_frontier", "diversity", "length"]:
        data = (out / f"{name}.png").read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000
    md = (out / "report.md").read_text()
    assert "![Judge score against KL during training](training_frontier.png)" in md
    assert "- judge_score.png: KL=0 not drawn" in md
    assert "- training_frontier.png: KL=0 not drawn" in md
    assert "| metric | before PPO | after PPO |" in md
    assert "| judge_mean | -0.15 | 0.75 |" in md
    assert "| 1 | Prompt 0 \\| with pipe | a dog. (0.100) | a happy dog. (0.900) |" in md
    assert "| 2 | Prompt 1 \\| with pipe | it was sad (-0.400) | it was fun (0.600) |" in md
    # first and last values: objective/kl is the third tag (offset 2) of the PPO run, steps 0..4
    assert "| `objective/kl` | 2 | 2.4 | 1 | 1.4 |" in md


def test_report_skips_plots_without_tags(tmp_path):
    _write_run(tmp_path / "run", ["objective/scores"])
    md_path = write_report(str(tmp_path / "run"), str(tmp_path / "out"))
    md = open(md_path).read()
    assert (tmp_path / "out" / "rm_score.png").stat().st_size > 1000
    for name in ["judge_score", "kl", "training_frontier", "diversity", "length"]:
        assert not (tmp_path / "out" / f"{name}.png").exists()
        assert f"- {name}.png skipped: no run logs" in md
    assert "Before and after" not in md


def test_report_needs_both_evaluations(tmp_path):
    _write_run(tmp_path / "run", ["objective/scores"])
    with pytest.raises(ValueError, match="both before and after"):
        write_report(str(tmp_path / "run"), str(tmp_path / "out"), before="x.json")

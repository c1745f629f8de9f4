"""What the ``rlhf-lit iterate`` tests share (test_iterate.py, test_iterate_bonbon.py): the loop run in this
process with a stand-in for its fits, its JSONL files read back, its one error line."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from assets_paths import STORIES260K, TINYSTORIES
from cli_in_process import run_main

from rlhf_lit.commands import iterate_command

JUDGE = "iterate_judges:length_judge"
"""Longer is better: deterministic, and the tiny policy's responses differ in length (tests/commands/iterate_judges.py)."""


def tiny_loop(tmp_path: Path, policy_groups: dict, **groups) -> Path:
    """A tiny loop config in ``tmp_path`` (2 iterations of 4 fresh prompts x 3 responses, judged by :data:`JUDGE`)
    with the policy's groups, then ``groups`` over it (a mapping merged into its group, anything else replacing
    the key); its path."""
    config = {
        "run_dir": str(tmp_path / "run"),
        "iterations": 2,
        "seed": 3,
        "sft_model": str(STORIES260K),
        "prompts": {"path": str(TINYSTORIES), "skip": 1000, "words": 6, "held_out": 2, "per_iteration": 4},
        "sampling": {"responses_per_prompt": 3, "max_new_tokens": 6, "batch_size": 16},
        "labeler": {"kind": "judge", "source": JUDGE},
        **policy_groups,
    }
    for group, values in groups.items():
        config[group] = {**config.get(group, {}), **values} if isinstance(values, dict) else values
    path = tmp_path / "iterate.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def iterate(config: Path, runner, monkeypatch, cwd: Path):
    """``rlhf-lit iterate --config <config>`` in this process with ``runner`` as the fits."""
    monkeypatch.setattr(iterate_command, "run_fit", runner)
    return run_main("iterate", "--config", str(config), cwd=cwd)


def in_process_fits(args: list[str], log_path: str) -> int:
    """``rlhf-lit <args>`` through ``rlhf_lit.cli.main`` in this process (no second import of the CLI), its output
    written to ``log_path``."""
    result = run_main(*args, cwd=Path.cwd())
    Path(log_path).write_text(result.stdout + result.stderr, encoding="utf-8")
    return result.returncode


def jsonl(path: Path) -> list[dict]:
    """The records of a JSONL file."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def error_line(result) -> str:
    """The one ``rlhf-lit: error:`` line of a run (and no traceback)."""
    lines = [line for line in result.stderr.splitlines() if line.startswith("rlhf-lit: error:")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return lines[0]

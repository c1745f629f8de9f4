"""What the ``rlhf-lit iterate`` tests share (test_iterate*.py): the loop run in this process, a tiny loop
config, a stand-in for its fits (:class:`FakeFits`), its JSONL files read back, its one error line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml
from assets_paths import CONFIGS, STORIES260K, TINYSTORIES
from cli_in_process import run_main

from rlhf_lit.artifacts import EXPORT_MARKER
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


class FakeFits:
    """A stand-in for ``rlhf-lit fit``: records the arguments, copies a tiny model to the stage's export."""

    def __init__(self, rm: Path, kill_at: tuple[int, str] | None = None, policy: Path = STORIES260K) -> None:
        self.rm, self.kill_at, self.policy, self.calls = rm, kill_at, policy, []

    def __call__(self, args: list[str], log_path: str) -> int:
        options = dict(zip(args[1::2], args[2::2]))  # ["fit", "--config", X, ...]: option -> value
        stage = "reward_model" if "--model.init_args.model" in options else "ppo"
        t = int(Path(options["--run_dir"]).name.split("_")[1])
        self.calls.append((t, stage, options))
        export = Path(options["--run_dir"]) / stage / "model"
        if self.kill_at == (t, stage):  # killed mid-fit: a checkpoint folder and a half-filled temporary export
            (export.parent / "version_0" / "checkpoints").mkdir(parents=True, exist_ok=True)
            (export.parent / ".model.tmp-killed").mkdir(parents=True, exist_ok=True)
            raise RuntimeError(f"killed during the {stage} fit of iteration {t}")
        shutil.copytree(self.rm if stage == "reward_model" else self.policy, export)
        (export / EXPORT_MARKER).write_text("{}", encoding="utf-8")
        Path(log_path).write_text("fake fit\n", encoding="utf-8")
        return 0

    def starts(self, t: int, stage: str) -> str:
        """The model the stage of iteration t started from (the RM's ``model``, PPO's ``sft_model``)."""
        key = "--model.init_args.model" if stage == "reward_model" else "--model.init_args.sft_model"
        return next(options[key] for (i, s, options) in self.calls if (i, s) == (t, stage))


def loop_config(tmp_path: Path, **groups) -> Path:
    """A tiny PPO loop config in ``tmp_path`` (:func:`iterate_helpers.tiny_loop`), groups overridden."""
    ppo_groups = {
        "reward_model": {"config": str(CONFIGS / "offline/iterate/reward_model.yaml"), "held_out_fraction": 0.25},
        "ppo": {"config": str(CONFIGS / "offline/iterate/ppo.yaml")},
    }
    return tiny_loop(tmp_path, ppo_groups, **groups)

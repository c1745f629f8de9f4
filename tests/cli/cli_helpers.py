"""Running `rlhf-lit` as a user does, on tiny offline models and configs written per test.

Two ways, one result type (:class:`subprocess.CompletedProcess`: ``returncode``, ``stdout``,
``stderr``), so a test reads the same either way:

- :func:`rlhf_lit` starts the console script in a subprocess: what a user runs, at the price of
  importing the CLI again (about 5 s on the development machines). The suite keeps one real
  process per message format (a jsonargparse option error, an error raised during fit, an
  argparse command's error) and the end-to-end runs whose output a user reads (progress bars,
  warnings, DDP launches).
- :func:`run_main` (from ``tests/cli_in_process.py``) calls the same entry function,
  ``rlhf_lit.cli.main(args)``, in the test's own process with stdout / stderr captured and every
  piece of global state main() touches restored afterwards, so tests stay independent.
- :func:`rlhf_lit_forked` (from ``tests/cli_forked.py``) runs that entry in a process forked from
  the test's: a real process (signals, exit status, Lightning's launcher starting rank 1 as a new
  interpreter) without paying the imports again. The runs of two processes and the killed or
  signalled runs use it; the console script stays for what only a fresh interpreter shows.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from assets_paths import ASSETS, HH_RLHF, ROOT, STORIES260K_CHAT, TINYSTORIES  # noqa: F401  (re-exported for the CLI tests)
from assets_paths import STORIES260K as STORIES
from cli_forked import run as rlhf_lit_forked  # noqa: F401  (re-exported)
from cli_in_process import isolated_main_state, run_main  # noqa: F401  (re-exported)
from suite_env import subprocess_env

from rlhf_lit.tokenizer import load_tokenizer

CLI = Path(sys.executable).parent / "rlhf-lit"
"""The console script of this environment: what a user types."""


def is_loop_config(path: Path) -> bool:
    """An `rlhf-lit iterate` config (top-level `iterations`, no `model`), not a `fit` one:
    tests/commands/test_iterate.py parses those."""
    values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return "iterations" in values and "model" not in values


FIT_CONFIGS = sorted(p for p in (ROOT / "configs").rglob("*.yaml") if not is_loop_config(p))
"""Every shipped ``rlhf-lit fit`` config."""


def rlhf_lit(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: int = 600
) -> subprocess.CompletedProcess:
    """``rlhf-lit <args>`` in a subprocess in ``cwd``, in the suite's environment (one thread, no debug
    switch, no Hugging Face offline flags: :func:`suite_env.subprocess_env`) plus ``env``."""
    return subprocess.run(
        [str(CLI), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=subprocess_env(env)
    )


def write_yaml(path: Path, config: dict) -> Path:
    """Write ``config`` as YAML (in key order) to ``path``, creating its folder; returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def ppo_config(root: Path, sft: Path, rm: Path, **model_overrides) -> dict:
    """A PPO run of a few seconds: stories260K policy, 4 prompts a rollout, a checkpoint every rollout."""
    model = {
        "sft_model": str(sft),
        "reward_model": str(rm),
        "sampling": {"max_new_tokens": 12, "temperature": 1.0},
        "ppo": {"epochs": 2, "minibatch_size": 2},
        "kl": {"kind": "adaptive", "init_coef": 0.1, "target": 1.0, "horizon": 100},
        "optimizer": {"lr": 3.0e-4, "eps": 1.0e-5, "warmup_steps": 1, "schedule": "linear"},
        "max_rollouts": 4,
        "rollout_seed": 3,
        "export_dir": str(root / "export"),
    }
    model.update(model_overrides)
    return {
        "seed_everything": 7,
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "max_epochs": -1,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "logger": {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": str(root / "logs")},
            },
            "callbacks": [
                {
                    "class_path": "rlhf_lit.callbacks.RolloutCheckpoint",
                    "init_args": {"dirpath": str(root / "ckpt"), "every_n_rollouts": 1, "save_last": True},
                }
            ],
        },
        "model": {"class_path": "rlhf_lit.stages.PPOModule", "init_args": model},
        "data": {
            "class_path": "rlhf_lit.data.PromptDataModule",
            "init_args": {
                "train_path": str(TINYSTORIES),
                "format": "paragraphs",
                "prompt_words": 6,
                "max_records": 64,
                "batch_size": 4,
                "seed": 5,
            },
        },
    }


TWO_PROCESS_ROLLOUTS = 4
"""Rollouts of the shared two-process PPO runs (tests/cli/conftest.py: ``straight_ddp``, ``straight_fsdp2``)."""


def two_process_ppo(root: Path, rm: str, strategy: str, *callbacks: dict) -> Path:
    """``root/ppo.yaml``: PPO of :data:`TWO_PROCESS_ROLLOUTS` rollouts (linear schedule, a checkpoint
    every rollout) on 2 processes under ``strategy``, plus ``callbacks``; returns its path."""
    config = ppo_config(root, STORIES, rm, max_rollouts=TWO_PROCESS_ROLLOUTS)
    config["trainer"]["callbacks"] += list(callbacks)
    config["trainer"].update(strategy=strategy, devices=2)
    return write_yaml(root / "ppo.yaml", config)


def unseeded(config: dict) -> dict:
    """A :func:`ppo_config` with ``rollout_seed`` and ``data.seed`` unset: they follow ``seed_everything``."""
    del config["model"]["init_args"]["rollout_seed"], config["data"]["init_args"]["seed"]
    return config


def sft_config(root: Path, train_path: Path | str, **overrides) -> dict:
    """An SFT run of a few steps on stories260K."""
    model = {"model": str(STORIES), "optimizer": {"lr": 1.0e-3}, "export_dir": str(root / "export")}
    data = {
        "train_path": str(train_path),
        "format": "paragraphs",
        "max_records": 32,
        "batch_size": 4,
        "max_length": 64,
        "max_prompt_length": 16,
    }
    data.update(overrides.pop("data", {}))
    model.update(overrides.pop("model", {}))
    return {
        "seed_everything": 7,
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "max_steps": overrides.pop("max_steps", 3),
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "log_every_n_steps": 1,
            "logger": {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": str(root / "logs")},
            },
            "callbacks": [
                {
                    "class_path": "rlhf_lit.callbacks.Checkpoint",
                    "init_args": {"dirpath": str(root / "ckpt"), "save_last": True, "every_n_train_steps": 2},
                }
            ],
        },
        "model": {"class_path": "rlhf_lit.stages.SFTModule", "init_args": model},
        "data": {"class_path": "rlhf_lit.data.SFTDataModule", "init_args": data},
    }


def error_line(result: subprocess.CompletedProcess) -> str:
    """The one ``rlhf-lit: error:`` line of a failed run (asserting there is exactly one and no traceback)."""
    lines = [line for line in result.stderr.splitlines() if line.startswith("rlhf-lit: error:")]
    assert len(lines) == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return lines[0]


def failure_tail(stderr: str, chars: int = 3000) -> str:
    """The end of a failed multi-process run's stderr, after the last lines each rank wrote
    (``[rankN]:`` prefixes): the rank that failed first is often not the one whose error ends the log."""
    ranks: dict[str, list[str]] = {}
    for line in stderr.splitlines():
        if line.startswith("[rank") and "]:" in line:
            ranks.setdefault(line[: line.index("]:") + 2], []).append(line)
    heads = [f"--- last lines of {rank}\n" + "\n".join(lines[-8:]) for rank, lines in sorted(ranks.items())]
    return "\n".join([*heads, "--- end of stderr", stderr[-chars:]])


def tiny_ppo_overrides(run: str) -> tuple[str, ...]:
    """Options after ``--config configs/offline/ppo*.yaml`` for a 2-rollout PPO run on stories260K (the run's
    reward model from ``--run_dir``), logging every rollout to ``<run>/ppo/.../metrics.csv``."""
    return (
        "--model.init_args.sft_model",
        str(STORIES),
        "--model.init_args.max_rollouts",
        "2",
        "--model.init_args.sampling.max_new_tokens",
        "8",
        "--model.init_args.ppo.epochs",
        "1",
        "--model.init_args.ppo.minibatch_size",
        "2",
        "--data.init_args.train_path",
        str(TINYSTORIES),
        "--data.init_args.max_records",
        "16",
        "--data.init_args.batch_size",
        "4",
        "--trainer.logger",
        "lightning.pytorch.loggers.CSVLogger",
        "--trainer.logger.init_args.save_dir",
        f"{run}/ppo",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
    )


def ids_of(text: str, policy: str = str(STORIES260K_CHAT)) -> list[int]:
    """``<s>`` (id 1, the llama BOS) and the hand-written ``text`` tokenized without specials: the ids a
    stories260K policy (by default the chat one) is given for a prompt written out by hand."""
    return [1, *load_tokenizer(policy)(text, add_special_tokens=False)["input_ids"]]

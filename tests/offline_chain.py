"""One offline SFT -> RM -> PPO chain for the whole test session, run through the real ``rlhf-lit fit``.

The chain is the README's ``--run_dir`` recipe on stories260K with tiny budgets (3 SFT steps, 3 RM
steps, 2 PPO rollouts), each stage a subprocess of the console script with command-line options
only, in an empty working directory. It is built once per session (once across pytest-xdist
workers too: the first worker builds it under a file lock, the others wait and read it) and the
tests that need trained exports, checkpoints or run directories share it: the ``--run_dir`` tests,
the commands (``rlhf-lit evaluate``) and the demo's frontier loader.

The shared directory is read-only by convention: a test that writes into the chain (runs a stage
again, resumes a checkpoint) copies it first with :meth:`OfflineChain.copy_to`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import cli_forked
from assets_paths import HH_RLHF, STORIES260K, TINYSTORIES

QUIET = (
    "--trainer.accelerator",
    "cpu",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.enable_model_summary",
    "false",
)
SFT = (
    "fit",
    "--model",
    "rlhf_lit.stages.SFTModule",
    "--model.model",
    str(STORIES260K),
    "--data",
    "rlhf_lit.data.SFTDataModule",
    "--data.train_path",
    str(TINYSTORIES),
    "--data.format",
    "paragraphs",
    "--data.max_records",
    "32",
    "--data.batch_size",
    "4",
    "--data.max_length",
    "64",
    "--data.max_prompt_length",
    "16",
    "--trainer.max_steps",
    "3",
    *QUIET,
)
"""``rlhf-lit`` arguments of the SFT stage (a run directory is added by the caller)."""
RM = (
    "fit",
    "--model",
    "rlhf_lit.stages.RewardModelModule",
    "--data",
    "rlhf_lit.data.PreferenceDataModule",
    "--data.train_path",
    str(HH_RLHF),
    "--data.format",
    "hh_rlhf",
    "--data.max_records",
    "32",
    "--data.val_fraction",
    "0.25",
    "--data.batch_size",
    "4",
    "--data.max_length",
    "64",
    "--data.max_prompt_length",
    "48",
    "--trainer.max_steps",
    "3",
    *QUIET,
)
"""``rlhf-lit`` arguments of the RM stage: its model is the run directory's SFT export."""
PPO = (
    "fit",
    "--model",
    "rlhf_lit.stages.PPOModule",
    "--model.max_rollouts",
    "2",
    "--model.sampling.max_new_tokens",
    "8",
    "--model.ppo.epochs",
    "1",
    "--model.ppo.minibatch_size",
    "2",
    "--data",
    "rlhf_lit.data.PromptDataModule",
    "--data.train_path",
    str(TINYSTORIES),
    "--data.format",
    "paragraphs",
    "--data.max_records",
    "16",
    "--data.batch_size",
    "4",
    "--trainer.max_epochs",
    "-1",
    *QUIET,
)
"""``rlhf-lit`` arguments of the PPO stage: SFT and reward model from the run directory."""
STAGE_ARGS = {"sft": SFT, "reward_model": RM, "ppo": PPO}
RUN_DIR = "runs/exp1"
"""The chain's ``--run_dir``, relative to its working directory."""


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``rlhf-lit <args>`` in a process of its own (forked from this one: tests/cli_forked.py) in
    ``cwd``, in the suite's environment (tests/suite_env.py)."""
    return cli_forked.run(*args, cwd=cwd)


@dataclass(frozen=True)
class OfflineChain:
    """The built chain: ``cwd`` holds only ``runs/exp1/{sft,rm,ppo}``; ``results`` are the three
    stages' completed processes (exit status, stdout, stderr) as :func:`run_cli` returned them."""

    cwd: Path
    results: dict[str, subprocess.CompletedProcess]

    @property
    def run(self) -> Path:
        """``<cwd>/runs/exp1``."""
        return self.cwd / RUN_DIR

    def export(self, stage: str) -> Path:
        """The exported model of ``stage`` (``sft``, ``reward_model`` or ``ppo``)."""
        return self.run / stage / "model"

    def checkpoints(self, stage: str) -> list[Path]:
        """The checkpoints Lightning wrote for ``stage`` (its logger's ``version_0/checkpoints``)."""
        return sorted((self.run / stage / "version_0" / "checkpoints").glob("*.ckpt"))

    def copy_to(self, where: Path) -> OfflineChain:
        """A private copy of the chain's working directory at ``where`` (for tests that write into it);
        modification times are kept, and the chain's paths are relative, so the copy runs as the original."""
        shutil.copytree(self.cwd, where, symlinks=True)
        return OfflineChain(where, self.results)


def build_chain(cwd: Path) -> dict[str, subprocess.CompletedProcess]:
    """Run SFT, RM and PPO with ``--run_dir runs/exp1`` in ``cwd``; stops at the first failing stage.
    Returns each stage's completed process (the failing one last)."""
    results = {}
    for stage, args in STAGE_ARGS.items():
        results[stage] = run_cli(*args, "--run_dir", RUN_DIR, cwd=cwd)
        if results[stage].returncode != 0:
            break
    return results


def save_results(path: Path, results: dict[str, subprocess.CompletedProcess]) -> None:
    """Write the stages' exit statuses and output as JSON (what other xdist workers read back)."""
    data = {
        stage: {"args": r.args, "returncode": r.returncode, "stdout": r.stdout, "stderr": r.stderr}
        for stage, r in results.items()
    }
    path.write_text(json.dumps(data), encoding="utf-8")


def load_results(path: Path) -> dict[str, subprocess.CompletedProcess]:
    """The results :func:`save_results` wrote."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return {
        stage: subprocess.CompletedProcess(r["args"], r["returncode"], r["stdout"], r["stderr"])
        for stage, r in data.items()
    }


def shared_chain(root: Path) -> OfflineChain:
    """The chain under ``root`` (``root/work`` its working directory, ``root/results.json`` the stages'
    output), built by the first caller and read by the later ones, across processes: a file lock
    (``root.lock``) serialises the build, and ``results.json`` is written only once every stage has
    been run, so a reader never sees half a chain. A failed build is not cached: the next caller runs
    it again (and fails the same way, with its own message)."""
    from filelock import FileLock

    root.mkdir(parents=True, exist_ok=True)
    results_file = root / "results.json"
    with FileLock(str(root) + ".lock"):
        if results_file.exists():
            return OfflineChain(root / "work", load_results(results_file))
        work = root / "work"
        shutil.rmtree(work, ignore_errors=True)  # a build that failed before
        work.mkdir()
        results = build_chain(work)
        if all(r.returncode == 0 for r in results.values()) and len(results) == len(STAGE_ARGS):
            save_results(results_file, results)
        return OfflineChain(work, results)

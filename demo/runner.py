"""The demo's side of running its studies: ``rlhf-lit fit`` commands, the environment and timing of its
runs (the runs themselves are the library's, :mod:`rlhf_lit.child_runs`), the held-out evaluation of a
policy, and the folders a study owns.

Every training stage, the preference command and the evaluation run as the commands a user would
type, one thread each (:data:`THREAD_ENV`), with the checkout on ``PYTHONPATH`` (:func:`child_env`);
a failing run names its log (:class:`StageFailed` carries its tail).

- commands: :func:`fit_command` (``rlhf-lit fit --config C ...``) and the option groups the studies
  add to it: :func:`tb_logger`, :func:`rollout_checkpointing`, :func:`seed_overrides`;
- runs: :func:`run_logged` (one run in the demo's environment, its log written anew), ``run_pool``
  (:func:`rlhf_lit.child_runs.run_pool`: a function over jobs, N at a time), :func:`start_stages` /
  :func:`wait_stages` / :func:`run_stages` (commands started together, each timed to its own exit with
  its CPU time, the rest stopped on a failure);
- evaluation: :func:`held_out_metrics` (``python -m demo evaluate`` of a policy, cached in its JSON);
- folders: :func:`claim_study` (``--out`` marked by the study) and :func:`fresh_run` (a run's folder,
  cleared only when the study started it).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from demo.plan import ROOT
from rlhf_lit import child_runs
from rlhf_lit.artifacts import NotOwned, claim_directory, directory_state, remove_owned_directory, write_text_atomically
from rlhf_lit.child_runs import RunFailed, rlhf_lit_command
from rlhf_lit.child_runs import run_pool as run_pool
from rlhf_lit.integrity import check_json_file

THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
"""One thread per process: on tiny models two threads under load were measured 10-50x slower."""


# ------------------------------------------------------------------ commands
def child_env(threads: int = 1) -> dict[str, str]:
    """The environment of every subprocess: this one's, :data:`THREAD_ENV` (``threads`` torch threads: 1
    but for a large model's stage that runs alone), and the checkout first on ``PYTHONPATH`` (a
    ``python -m demo ...`` child finds the demo from whatever folder it starts in)."""
    path = os.environ.get("PYTHONPATH")
    counts = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    return {**os.environ, **THREAD_ENV, **counts, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else "")}


def fit_command(config: Path | str, overrides: Sequence[str]) -> list[str]:
    """``rlhf-lit fit --config <config> <overrides>``, run with this interpreter (``python -m rlhf_lit.cli``)."""
    return rlhf_lit_command(["fit", "--config", str(config), *overrides])


def tb_logger(folder: Path) -> list[str]:
    """The run's TensorBoard logs in ``<folder>/tb/version_0`` (the demo configs' logger)."""
    return [
        "--trainer.logger.init_args.save_dir",
        str(folder),
        "--trainer.logger.init_args.name",
        "tb",
        "--trainer.logger.init_args.version",
        "0",
    ]


def rollout_checkpointing(every: int, dirpath: Path, keep_all: bool = True) -> list[str]:
    """A ``RolloutCheckpoint`` (weights only) every ``every`` rollouts into ``dirpath``; ``keep_all``: every one kept."""
    return [
        "--trainer.enable_checkpointing",
        "true",
        "--trainer.callbacks+=rlhf_lit.callbacks.RolloutCheckpoint",
        "--trainer.callbacks.every_n_rollouts",
        str(every),
        "--trainer.callbacks.dirpath",
        str(dirpath),
        *(["--trainer.callbacks.save_top_k", "-1"] if keep_all else []),
        "--trainer.callbacks.save_weights_only",
        "true",
    ]


def seed_overrides(seed: int, rollouts: bool) -> list[str]:
    """The options a study's seed sets: ``seed_everything`` and ``data.seed`` (the data order and its
    held-out split), and with ``rollouts`` (PPO) ``model.rollout_seed`` (sampling and minibatch shuffles)."""
    common = ["--seed_everything", str(seed), "--data.init_args.seed", str(seed)]
    return common + (["--model.init_args.rollout_seed", str(seed)] if rollouts else [])


def evaluate_command(
    policy: Path | str, reference: Path | str, paragraphs: str, count: int, max_new_tokens: int, out: Path
) -> list[str]:
    """``python -m demo evaluate`` of ``policy`` on the first ``count`` held-out prompts, KL to ``reference``."""
    return [
        sys.executable,
        "-m",
        "demo",
        "evaluate",
        "--policy",
        str(policy),
        "--reference",
        str(reference),
        "--paragraphs",
        paragraphs,
        "--count",
        str(count),
        "--max-new-tokens",
        str(max_new_tokens),
        "--out",
        str(out),
    ]


# ------------------------------------------------------------------ one run, stages started together
class StageFailed(RunFailed):
    """A stage of the demo failed: :class:`~rlhf_lit.child_runs.RunFailed`, its log's last 40 lines in the message."""

    def __init__(self, stage: str, returncode: int, log_path: Path) -> None:
        super().__init__(f"stage {stage!r}", returncode, log_path)

    def __str__(self) -> str:
        return f"{super().__str__()}\n{self.tail(40)}"


def say(message: str) -> None:
    """Print ``[demo] <message>`` at once (the pipeline's progress lines)."""
    print(f"[demo] {message}", flush=True)


def run_logged(cmd: Sequence[str], log: Path | IO[str], what: str) -> float:
    """Run ``cmd`` in the demo's environment (:func:`child_env`), its command line then its output in ``log``;
    returns its wall seconds (:func:`rlhf_lit.child_runs.run_logged`).

    ``log`` is a path (written anew) or an open text file (appended to: a study's log of one run).

    Raises:
        RunFailed: ``cmd`` exited non-zero (``"<what> failed (exit status N): <its last line>; its log: <log>"``).
    """
    if not isinstance(log, Path):
        return child_runs.run_logged(cmd, log, what, env=child_env())
    with open(log, "w", encoding="utf-8") as f:
        return run_logged(cmd, f, what)


def _start(stage: str, cmd: list[str], logs: Path, threads: int) -> tuple[subprocess.Popen, Path]:
    """Start ``cmd`` (:func:`rlhf_lit.child_runs.start`) with ``threads`` torch threads, its output going to
    ``<logs>/<stage>.log``."""
    log_path = logs / f"{stage.replace('/', '_')}.log"  # dpo/beta_0.1 -> dpo_beta_0.1.log
    say(f"{stage}: {shlex.join(cmd)}")
    with open(log_path, "w", encoding="utf-8") as f:  # the child keeps its own handle
        proc = child_runs.start(cmd, f, env=child_env(threads))
    return proc, log_path


Running = dict[str, tuple[subprocess.Popen, Path, float]]
"""Started stages: name -> (process, log path, start time)."""


def start_stages(stages: dict[str, list[str]], logs: Path, threads: int = 1) -> Running:
    """Start the commands of ``stages`` in parallel (one process each, ``threads`` torch threads, logs in the
    folder ``logs``) without waiting. Whatever stops the starting (a stage that cannot start, a signal under
    :func:`rlhf_lit.child_runs.stop_on_signals`) stops the stages it had started."""
    running: Running = {}
    try:
        for name, cmd in stages.items():
            with child_runs.signals_held():  # a signal while a stage starts is raised once it is in `running`
                running[name] = (*_start(name, cmd, logs, threads), time.perf_counter())
    except BaseException:
        stop_stages(running)
        raise
    return running


def stop_stages(running: Running) -> None:
    """Stop the stages of ``running`` still alive (their results would be discarded) and reap them
    (:func:`rlhf_lit.child_runs.stop`: SIGTERM, a grace period, SIGKILL)."""
    child_runs.stop(*(proc for proc, _, _ in running.values()))


class Timings(dict):
    """Wall seconds per stage (the dict, in the order stages finish) and, in :attr:`cpu`, the CPU
    seconds (user + system) of each subprocess stage: on a machine shared with other jobs the wall
    time depends on their load, the CPU time much less."""

    def __init__(self) -> None:
        super().__init__()
        self.cpu: dict[str, float] = {}


POLL_S = 0.2
"""How often :func:`wait_stages` looks for finished stages (a stage's wall time is this exact)."""


def wait_stages(running: Running, timings: Timings, background: Running | None = None) -> None:
    """Wait for every stage of ``running``; raise :class:`StageFailed` at the first failure.

    Records each stage's wall time (from its own start to its exit, whichever order they finish
    in) and its CPU time in ``timings``. Stages of ``background`` that end meanwhile are timed and
    checked the same way and removed from it; the others keep running. When a stage fails, or the wait is
    interrupted (Ctrl-C, SIGTERM under :func:`rlhf_lit.child_runs.stop_on_signals`, any exception), every
    other one is stopped.
    """
    pending = dict(running)
    background = {} if background is None else background
    try:
        while pending:
            for group in (pending, background):
                for name, (proc, log_path, t0) in list(group.items()):
                    # wait4 instead of poll: the child's own resource usage comes with its exit status.
                    pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                    if pid == 0:
                        continue
                    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: tell Popen
                    del group[name]
                    timings[name] = time.perf_counter() - t0
                    timings.cpu[name] = usage.ru_utime + usage.ru_stime
                    if proc.returncode != 0:
                        raise StageFailed(name, proc.returncode, log_path)
                    say(f"{name}: done in {timings[name]:.1f} s ({timings.cpu[name]:.1f} s CPU)")
            if pending:
                time.sleep(POLL_S)
    except BaseException:
        # A failed stage, Ctrl-C, a signal under stop_on_signals, any error: the stages run in sessions of their
        # own (a terminal's Ctrl-C reaches this process alone), so none may outlive the wait.
        stop_stages(running)
        stop_stages(background)
        raise


def run_stages(stages: dict[str, list[str]], logs: Path, timings: Timings, threads: int = 1) -> None:
    """Run the commands of ``stages`` in parallel (``threads`` torch threads each) and wait for all; raise
    :class:`StageFailed` on any failure."""
    wait_stages(start_stages(stages, logs, threads), timings)


# ------------------------------------------------------------------ the held-out evaluation
def held_out_metrics(
    policy: Path | str,
    reference: Path | str,
    paragraphs: str,
    count: int,
    max_new_tokens: int,
    out: Path,
    log: Path | IO[str],
) -> dict:
    """The demo's held-out evaluation of ``policy`` (:func:`demo.held_out_eval.evaluate`, in a subprocess of
    one thread, its output in ``log``), unless ``out`` holds it already; the ``metrics`` of ``out``."""
    if not out.exists():
        cmd = evaluate_command(policy, reference, paragraphs, count, max_new_tokens, out)
        run_logged(cmd, log, f"the evaluation of {policy}")
    return check_json_file(out, want_object=False)["metrics"]


# ------------------------------------------------------------------ a study's folders
def claim_study(out: Path, marker: str, command: str) -> None:
    """Create ``out`` with ``marker``, or accept it when it has the marker; refuse any other non-empty folder.

    Raises:
        FileExistsError: ``out`` is a file, or a non-empty folder ``command`` did not write.
    """
    if directory_state(out, marker, follow_symlinks=True) in ("not_a_directory", "foreign"):
        raise FileExistsError(f"--out {out} is not empty and was not written by `{command}`")
    claim_directory(out, marker, json.dumps({"written_by": command}) + "\n")


def fresh_run(folder: Path, marker: str, label: str, command: str) -> None:
    """An empty ``folder`` marked by ``marker`` (its text ``label``): a run ``command`` began and did not
    finish (killed) is cleared and starts again from nothing; a folder without the marker is refused.

    Raises:
        FileExistsError: ``folder`` exists and was not started by ``command``.
    """
    if folder.exists():
        try:
            remove_owned_directory(folder, marker)
        except NotOwned:
            raise FileExistsError(f"{folder} was not started by `{command}`: move it away") from None
    folder.mkdir(parents=True)
    write_text_atomically(folder / marker, f"{label}\n")

"""Preemption: on SIGTERM or SIGUSR1, stop at the next consistent point, checkpoint there, and exit.

A scheduler that takes the machine back sends SIGTERM (SLURM's preemption and ``scancel``,
Kubernetes' pod eviction), then SIGKILL after a grace period; SLURM's ``--signal=USR1@<seconds>``
sends SIGUSR1 that many seconds before the time limit. :class:`Preemption` handles both alike:

- The signal handler only records the signal: a handler runs between two Python bytecodes of the
  main thread, in the middle of anything, where no state can be saved (and under ddp a collective
  call there could pair with another rank's unrelated one).
- The run goes on to the end of the current *unit*: the optimizer step of SFT, the reward model and
  DPO (with gradient accumulation, the batch that steps), the rollout of PPO (generation, scoring
  and every PPO epoch of minibatch updates). Its end is the one point where everything a resume
  continues is consistent: weights, optimizer states and schedules, the data position, PPO's
  rollout count and KL controller. Abandoning a unit halfway would leave nothing consistent to
  save (PPO's optimizer steps of the first epochs already applied), so it is finished.
- At that point every process takes part in one reduction of the signals received (the largest
  signal number wins), so under ddp all ranks stop at the same unit even when only rank 0 was
  signalled (Kubernetes signals the container's main process only). Then ``last.ckpt`` is written
  atomically (:func:`rlhf_lit.callbacks.checkpoint.save_atomically`) in the checkpoint callback's
  directory (``<log dir>/checkpoints`` without one), rank 0 logs one line with its path and the
  command that resumes from it, and every process exits with status ``128 + signal``: 143 for
  SIGTERM, 138 for SIGUSR1 (the status of a process killed by that signal, so schedulers and
  shells read it as "did not finish"). No export is written: the run has not finished.

Resuming from that ``last.ckpt`` with the logged command continues as if the run had never
stopped: the result equals an uninterrupted run's bit for bit (``tests/cli/test_preemption_cli.py``).

Lightning's own handling is replaced, not extended, while training runs: its SIGTERM handler
broadcasts from inside the handler (a collective at an arbitrary point of the other ranks) and its
loops then stop after any batch, also in the middle of gradient accumulation, without a checkpoint;
its SLURM requeue handler saves an HPC checkpoint from inside the handler, in the middle of a step
or rollout. The handlers are installed when training starts (:meth:`Preemption.on_train_start`)
and Lightning restores the process's earlier ones when fit ends. Before training starts (models
loading) a signal acts as it would without rlhf-lit; a signal during the run's last unit (or after
it) lets the run finish and export as it would have (:func:`run_is_over`), with status 0.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.exceptions import SIGTERMException

from rlhf_lit.callbacks.checkpoint import ROLLOUT_ATTRIBUTE, save_atomically

log = logging.getLogger(__name__)

STOP_SIGNALS: tuple[str, ...] = ("SIGTERM", "SIGUSR1")
"""The signals that stop a run at the next unit (by name: SIGUSR1 does not exist on Windows)."""
CHECKPOINT_NAME = "last.ckpt"
"""The file the stop writes, in the checkpoint directory: the one a resume names."""
PROGRAM = "rlhf-lit"


def exit_status(signum: int) -> int:
    """``128 + signum``: what a shell reports for a process that signal killed (143 for SIGTERM)."""
    return 128 + signum


class Preempted(SIGTERMException):
    """Raised on every process after the stop's checkpoint: Lightning's own exception for a run
    stopped by a signal (a ``SystemExit``), so fit unwinds as Lightning does for it (``on_exception``
    hooks, loggers finalised, no export) and the process exits with :func:`exit_status`."""

    def __init__(self, signum: int) -> None:
        super().__init__(exit_status(signum))
        self.signum = signum


def progress(trainer: Trainer, module: LightningModule) -> tuple[str, int]:
    """Where the run stands, counted in its units: finished rollouts (a module with an integer
    ``rollout_index``, PPO) or optimizer steps (``global_step``: SFT, reward model, DPO)."""
    rollouts = getattr(module, ROLLOUT_ATTRIBUTE, None)
    return ("rollout", rollouts) if isinstance(rollouts, int) else ("step", trainer.global_step)


def run_is_over(trainer: Trainer, module: LightningModule, batch_idx: int) -> bool:
    """Whether the unit that just ended was the run's last: PPO's ``max_rollouts`` reached, the
    Trainer's ``max_steps`` reached or its stop requested, the last batch of the last epoch.
    The same on every process (counters all ranks share), so no collective is needed to agree."""
    rollouts, limit = getattr(module, ROLLOUT_ATTRIBUTE, None), getattr(module, "max_rollouts", None)
    if isinstance(rollouts, int) and isinstance(limit, int):
        return rollouts >= limit
    if trainer.should_stop or (trainer.max_steps not in (None, -1) and trainer.global_step >= trainer.max_steps):
        return True
    last_epoch = trainer.max_epochs not in (None, -1) and trainer.current_epoch + 1 >= trainer.max_epochs
    return last_epoch and batch_idx + 1 >= trainer.num_training_batches


def checkpoint_path(trainer: Trainer) -> str:
    """``last.ckpt`` in the first checkpoint callback's directory, else in ``<log dir>/checkpoints``
    (where Lightning's default checkpoint callback would write); the same path on every rank."""
    callback = trainer.checkpoint_callback
    directory = getattr(callback, "dirpath", None)
    if directory is None:
        directory = os.path.join(trainer.log_dir or trainer.default_root_dir, "checkpoints")
    return trainer.strategy.broadcast(os.path.join(str(directory), CHECKPOINT_NAME))


def resume_command(command: Sequence[str], checkpoint: str) -> str:
    """``command`` with its ``--ckpt_path`` (if any) replaced by ``--ckpt_path <checkpoint>``, quoted for a shell."""
    kept, skip = [], False
    for arg in command:
        if skip:
            skip = False
        elif arg == "--ckpt_path":
            skip = True  # and its value
        elif not arg.startswith("--ckpt_path="):
            kept.append(arg)
    return shlex.join([*kept, "--ckpt_path", checkpoint])


class Preemption(Callback):
    """Stop on SIGTERM / SIGUSR1 at the end of the current optimizer step or PPO rollout, with a checkpoint.

    The ``rlhf-lit`` command adds it to every ``fit`` (module docstring for what it does).

    Args:
        command: the command line that started the run (program name first), for the resume
            command the stop logs; None: ``rlhf-lit`` and this process's arguments.
    """

    def __init__(self, command: Sequence[str] | None = None) -> None:
        self.command = list(command) if command is not None else [PROGRAM, *sys.argv[1:]]
        self.received: int | None = None  # the signal this process received, if any
        self._progress: tuple[str, int] | None = None

    def _record(self, signum: int, frame: FrameType | None) -> None:
        """The handler: only records the signal (the stop happens at the end of the unit)."""
        self.received = self.received or signum

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Take over the stop signals from Lightning's handlers (restored by Lightning when fit ends)."""
        if trainer.received_sigterm:  # a SIGTERM Lightning's handler caught before training started
            self.received = self.received or signal.SIGTERM
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            for name in STOP_SIGNALS:
                if hasattr(signal, name):
                    signal.signal(getattr(signal, name), self._record)
        self._progress = progress(trainer, pl_module)

    def on_train_batch_end(self, trainer: Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        """At the end of a unit, stop every process when any received a stop signal."""
        now = progress(trainer, pl_module)
        if now == self._progress:
            return  # not the end of a unit: a batch of gradient accumulation, PPO's final no-op step
        self._progress = now
        if run_is_over(trainer, pl_module, batch_idx):
            return  # the run finishes and exports as it would have; nothing is lost to a signal now
        signum = self.received or 0
        if trainer.world_size > 1:
            # every process reaches this point at the same unit, so the reduction pairs up across
            # ranks: one scalar per unit (Lightning's loop broadcasts one per batch under ddp anyway)
            mine = torch.tensor(signum, device=trainer.strategy.root_device)
            signum = int(trainer.strategy.reduce(mine, reduce_op="max").item())
        if signum:
            self.stop(trainer, signal.Signals(signum), now)

    def stop(self, trainer: Trainer, signum: signal.Signals, where: tuple[str, int]) -> None:
        """Write ``last.ckpt`` atomically, log where it is and how to resume, and raise :class:`Preempted`."""
        path = checkpoint_path(trainer)
        save_atomically(trainer, path)
        if trainer.is_global_zero:
            log.warning(
                "stopped by %s after %s %d: checkpoint %s; resume with: %s",
                signum.name,
                where[0],
                where[1],
                path,
                resume_command(self.command, path),
            )
        raise Preempted(int(signum))

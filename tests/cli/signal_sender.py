"""A callback that signals its own process at a chosen point of training: a preemption that lands
exactly there (in the middle of a PPO update, between two batches of gradient accumulation), for
runs made in the test's process (``run_main``). Listed in a test config as
``{"class_path": "signal_sender.SendSignal", ...}`` (``tests/cli`` is on ``sys.path``)."""

from __future__ import annotations

import os
import signal as signals
from typing import Literal

from lightning.pytorch import Callback


class SendSignal(Callback):
    """Send ``signal`` to this process at the ``at``-th call (from 1) of the hook ``hook``.

    Args:
        signal: ``SIGTERM`` or ``SIGUSR1``.
        hook: ``on_train_batch_start`` (before a batch's training step), ``on_before_optimizer_step``
            (in the middle of an update: PPO calls it for every minibatch step of every PPO epoch,
            for each optimizer) or ``on_validation_batch_start`` (also during the sanity check
            before training).
        at: which call of ``hook`` sends it.
    """

    def __init__(
        self,
        signal: Literal["SIGTERM", "SIGUSR1"],
        hook: Literal["on_train_batch_start", "on_before_optimizer_step", "on_validation_batch_start"],
        at: int,
    ) -> None:
        self.signal, self.hook, self.at, self.calls = signal, hook, at, 0

    def _count(self, hook: str) -> None:
        if hook == self.hook:
            self.calls += 1
            if self.calls == self.at:
                os.kill(os.getpid(), getattr(signals, self.signal))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        """Counts for ``hook="on_train_batch_start"``."""
        self._count("on_train_batch_start")

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        """Counts for ``hook="on_before_optimizer_step"``."""
        self._count("on_before_optimizer_step")

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        """Counts for ``hook="on_validation_batch_start"``."""
        self._count("on_validation_batch_start")

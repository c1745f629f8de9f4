"""A progress bar that counts what a stage's run length counts: rollouts for PPO, optimizer steps otherwise.

Lightning's bar counts the batches of the current epoch. PPO runs one rollout per batch until
``max_rollouts`` with ``max_epochs: -1``, so that bar showed ``Epoch 0/-2``, a total of one pass
over the prompt loader and a time "remaining" that never came; SFT / RM runs bounded by
``max_steps`` showed ``Epoch 1/-2``. This bar is one bar for the whole fit:

- a stage with ``max_rollouts`` and ``rollout_index`` (PPO): ``rollout k/max_rollouts``;
- any other stage: ``step k/total`` with total = ``trainer.estimated_stepping_batches`` (``max_steps``,
  or epochs x batches / accumulation), unknown (no total) when neither bounds the run.

It starts at the restored count on resume (``rollout_index`` / ``global_step``), and its rate and
ETA count only the work done in this process (tqdm's ``initial``), so a resumed run does not look
faster than it is. The postfix is what the stage logs with ``prog_bar=True`` (PPO: ``score``,
``kl``; SFT / RM: ``train/loss``, ``val/loss`` ...), without Lightning's ``v_num``.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

ROLLOUT, STEP = "rollout", "step"


def run_progress(trainer: Trainer, module: LightningModule) -> tuple[str, int, int | None]:
    """``(unit, done, total)`` of a fit: rollouts for a rollout stage, optimizer steps otherwise.

    ``total`` is None when the run has no known end (tqdm then shows a count without ETA).
    """
    max_rollouts = getattr(module, "max_rollouts", None)
    if max_rollouts is not None and hasattr(module, "rollout_index"):
        return ROLLOUT, int(module.rollout_index), int(max_rollouts)
    total = trainer.estimated_stepping_batches
    return STEP, int(trainer.global_step), None if total is None or math.isinf(total) else int(total)


class RunProgressBar(TQDMProgressBar):
    """One bar per fit counting rollouts (PPO) or optimizer steps (SFT, RM), with rate, ETA and the
    stage's progress-bar metrics. The default bar of the ``rlhf-lit`` command.

    Args:
        refresh_rate: update the bar every this many batches (and at the end).
        process_position: the bar's line, for several bars at once (as in Lightning's bar).
        leave: keep the finished bar on screen.
    """

    BAR_FORMAT = "{desc} {n_fmt}/{total_fmt} {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
    """rate_fmt (not Lightning's rate_noinv_fmt): a 40 s rollout reads ``40.0s/rollout``, not ``0.03it/s``."""

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = True) -> None:
        super().__init__(refresh_rate=refresh_rate, process_position=process_position, leave=leave)
        self._unit, self._done, self._total = STEP, 0, None

    def _tqdm(self, description: str, position: int, leave: bool, **settings: Any) -> Tqdm:
        """A bar at line ``position`` on stderr (progress is a diagnostic: stdout stays clean for
        results), in Lightning's format unless ``settings`` say otherwise."""
        settings = {"bar_format": TQDMProgressBar.BAR_FORMAT, **settings}
        return Tqdm(
            desc=description,
            position=position,
            disable=self.is_disabled,
            leave=leave,
            dynamic_ncols=True,
            file=sys.stderr,
            **settings,
        )

    def init_train_tqdm(self) -> Tqdm:
        """The training bar: the count of the fit (rollouts or steps), with its rate per unit."""
        return self._tqdm(
            self._unit,
            2 * self.process_position,
            self._leave,
            unit=self._unit,
            initial=self._done,
            total=self._total,
            smoothing=0,
            bar_format=self.BAR_FORMAT,
        )

    def init_validation_tqdm(self) -> Tqdm:
        """Lightning's validation bar, below the training bar."""
        has_main_bar = self.trainer.state.fn != "validate"  # as Lightning's: no training bar in `validate`
        return self._tqdm(self.validation_description, 2 * self.process_position + has_main_bar, not has_main_bar)

    def init_sanity_tqdm(self) -> Tqdm:
        """Lightning's sanity-check bar."""
        return self._tqdm(self.sanity_check_description, 2 * self.process_position, False)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Open the one bar of the fit at the restored count (rate and ETA from this process's work)."""
        self._unit, self._done, self._total = run_progress(trainer, pl_module)
        self.train_progress_bar = self.init_train_tqdm()

    def on_train_epoch_start(self, trainer: Trainer, *_: Any) -> None:
        """Keep counting across epochs (Lightning's bar restarts at 0 per epoch); name the epoch when
        the run has more than one."""
        if trainer.max_epochs is not None and trainer.max_epochs > 1 and self._unit == STEP:
            self.train_progress_bar.set_description(f"epoch {trainer.current_epoch + 1}/{trainer.max_epochs} {STEP}")

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Move to the stage's count (a rollout, or the optimizer steps taken) and show its metrics."""
        _, done, total = run_progress(trainer, pl_module)
        bar = self.train_progress_bar
        if bar is not None and not bar.disable and self._should_update(done, total or 0):
            bar.n = done
            bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)
            bar.refresh()

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Show the metrics as they are at the end of the epoch; the bar stays open for the next."""
        if not self.train_progress_bar.disable:
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))

    def get_metrics(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
        """The stage's ``prog_bar=True`` metrics, without Lightning's logger version ``v_num``."""
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics

"""Checkpoints written atomically, with ``last.ckpt`` the state at the end of fit; PPO's counted in rollouts.

:class:`Checkpoint` is Lightning's ``ModelCheckpoint`` with two promises kept: every file is written
atomically (below), and with ``save_last`` the ``last.ckpt`` holds the state at the end of fit
(``ModelCheckpoint`` writes it only with a regular save, so a run whose last validation came before
its last step leaves a ``last.ckpt`` that lags, and a resume replays work). The SFT and RM configs
use it; :class:`RolloutCheckpoint` builds on it for PPO.

Under manual optimization ``global_step`` counts every ``opt.step()`` of every optimizer (PPO
makes ``epochs x minibatches / grad_accum x optimizers`` of them per rollout), so
``ModelCheckpoint(every_n_train_steps=...)`` makes the user compute steps by hand and breaks when
any of those settings changes. :class:`RolloutCheckpoint` counts what the user means: finished
rollouts, read from the module's ``rollout_index`` (the PPO stage's count of completed rollouts).

Atomic writes: Lightning writes a local checkpoint through an fsspec transaction, i.e. into a file
in the system temp directory that is then moved into place; when that directory is on another
filesystem the move is a copy into the final name, which a crash leaves half-written. Here every
checkpoint (``last.ckpt`` included) is first written whole under a hidden temporary name next to
its final name (``.<name>.tmp``, same directory, so same filesystem) and then renamed with
``os.replace`` (the rule of :mod:`rlhf_lit.artifacts`), which is atomic on POSIX: the final name holds either the previous complete
checkpoint or the new complete one, never a part. Remote paths (``s3://`` ...) keep Lightning's
write: object stores commit whole objects.
"""

from __future__ import annotations

import glob
import os
import shutil
from typing import Any, Literal
from weakref import proxy

import torch
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import AsyncCheckpointIO
from lightning.pytorch.trainer.states import TrainerFn

from rlhf_lit.artifacts import hidden_sibling, remove_path, replace_path
from rlhf_lit.option_values import check_least

ROLLOUT_ATTRIBUTE = "rollout_index"
"""The module attribute holding the number of finished rollouts (``PPOModule.rollout_index``)."""
TMP_SUFFIX = ".tmp"
"""A checkpoint is written to ``.<name>.tmp`` in its directory, then renamed to ``<name>``."""
OLD_SUFFIX = ".old"
"""A directory checkpoint being replaced is moved to ``.<name>.old`` for the swap, then removed."""


def temporary_path(filepath: str) -> str:
    """The hidden sibling ``.<name>.tmp`` a checkpoint is written to before its rename."""
    return hidden_sibling(filepath, TMP_SUFFIX)


def save_atomically(trainer: Trainer, filepath: str, weights_only: bool = False) -> None:
    """Save the trainer's checkpoint to ``filepath`` whole: written to ``.<name>.tmp`` (by every rank,
    for sharded strategies), then renamed (by rank 0). Every rank calls it. A remote path is
    written as Lightning writes it (object stores commit whole objects)."""
    if not _is_local_file_protocol(filepath):
        trainer.save_checkpoint(filepath, weights_only)
        return
    tmp = temporary_path(filepath)
    if trainer.is_global_zero:
        remove_path(tmp)  # a leftover of a crashed write: never mix old shards into a new save
    trainer.strategy.barrier("rlhf_lit.Checkpoint.clean")
    trainer.save_checkpoint(tmp, weights_only)  # returns after a barrier
    if trainer.is_global_zero:
        replace_path(tmp, filepath, OLD_SUFFIX)  # a directory (sharded) old one: moved aside first
    trainer.strategy.barrier("rlhf_lit.Checkpoint.replace")


class Checkpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint``, written atomically, whose ``last.ckpt`` is the end-of-fit state.

    Takes ``ModelCheckpoint``'s arguments. Differences: every file is written under a temporary
    name and renamed (module docstring); with ``save_last``, ``last.ckpt`` is written again when
    training ends unless the final step was just saved, so resuming from it continues exactly
    where fit stopped.
    """

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Refuse asynchronous writes (the file is not there yet when it would be renamed); remove
        temporary files a crash left."""
        if isinstance(trainer.strategy.checkpoint_io, AsyncCheckpointIO):
            raise ValueError(
                f"{type(self).__name__} writes each checkpoint to a temporary name and renames it when "
                "complete, which AsyncCheckpointIO does not allow; drop the AsyncCheckpointIO plugin"
            )
        super().setup(trainer, pl_module, stage)
        if trainer.is_global_zero and self.dirpath and _is_local_file_protocol(self.dirpath):
            pattern = os.path.join(glob.escape(str(self.dirpath)), f".*{self.FILE_EXTENSION}")
            for leftover in glob.glob(pattern + TMP_SUFFIX) + glob.glob(pattern + OLD_SUFFIX):
                remove_path(leftover)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Write ``last.ckpt`` with the final state, unless the last save already holds it."""
        if not self.save_last or trainer.fast_dev_run or trainer.sanity_checking:
            return
        if self._final_state_saved(trainer):
            return
        filepath = self.format_checkpoint_name(self._monitor_candidates(trainer), self.CHECKPOINT_NAME_LAST)
        self._save_checkpoint(trainer, filepath)  # a full file, also with save_last="link"
        self.last_model_path = filepath

    def _final_state_saved(self, trainer: Trainer) -> bool:
        """Whether the newest save already holds the state training ended with."""
        return bool(self._last_checkpoint_saved) and self._last_global_step_saved == trainer.global_step

    def _save_checkpoint(self, trainer: Trainer, filepath: str) -> None:
        """Write to ``.<name>.tmp`` (all ranks, for sharded strategies), then rename (rank 0); a remote
        path as Lightning writes it (:func:`save_atomically`)."""
        save_atomically(trainer, filepath, self.save_weights_only)
        # what ModelCheckpoint._save_checkpoint records after its write
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))

    @staticmethod
    def _link_checkpoint(trainer: Trainer, filepath: str, linkpath: str) -> None:
        """``save_last="link"``: make the link under the temporary name, then rename it over
        ``linkpath`` (ModelCheckpoint deletes ``linkpath`` first, leaving a moment without it)."""
        if trainer.is_global_zero and os.path.abspath(filepath) != os.path.abspath(linkpath):
            tmp = temporary_path(linkpath)
            remove_path(tmp)
            try:
                os.symlink(os.path.relpath(filepath, os.path.dirname(linkpath)), tmp)
            except OSError:  # no symlinks (Windows without the privilege): a copy
                if os.path.isdir(filepath):
                    shutil.copytree(filepath, tmp)
                else:
                    shutil.copy(filepath, tmp)
            replace_path(tmp, linkpath, OLD_SUFFIX)
        trainer.strategy.barrier()


class RolloutCheckpoint(Checkpoint):
    """Save a checkpoint after every ``every_n_rollouts``-th rollout, atomically.

    A ``ModelCheckpoint`` whose only trigger is the rollout count: after the training step that
    finishes rollout ``n`` (the module's ``rollout_index`` is then ``n``), it saves when
    ``n % every_n_rollouts == 0``; a rollout already saved (e.g. the one a run resumed from) is
    not saved again. Epoch-end and validation-end saves of ``ModelCheckpoint`` do not happen;
    ``save_last`` still writes ``last.ckpt`` with every save (and at the end of training when
    nothing was saved), ``save_on_exception`` still saves on an exception. ``rollout`` can be
    used in ``filename`` and as ``monitor``. All files are written atomically (module docstring).

    Args:
        every_n_rollouts: save after rollout ``n`` when ``n % every_n_rollouts == 0``.
        dirpath: directory of the checkpoints; None: ``<logger dir>/checkpoints`` (as Lightning).
        filename: name template without ``.ckpt``; metrics (``rollout``, ``step``, ``epoch``,
            logged values such as ``score``) in braces. None: ``rollout={rollout}``.
        monitor: logged quantity ranking the checkpoints for ``save_top_k``; None: the newest
            are kept.
        verbose: log each save decision.
        save_last: also keep ``last.ckpt`` (the newest checkpoint); ``link`` makes it a symlink.
        save_top_k: how many checkpoints to keep: -1 all, 0 none (only ``last``), k the best k
            by ``monitor`` (without ``monitor`` only 1 is allowed: the newest).
        save_on_exception: save a checkpoint when training raises.
        save_weights_only: save only the model weights (such a checkpoint cannot resume a run).
        mode: ``min`` or ``max``: which ``monitor`` values are best.
        auto_insert_metric_name: ``{rollout}`` in ``filename`` becomes ``rollout=3``.
        enable_version_counter: add ``-v1``, ``-v2`` when a name exists already, instead of
            overwriting it.
    """

    ROLLOUT_KEY = "rollout"

    def __init__(
        self,
        every_n_rollouts: int = 1,
        dirpath: str | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        verbose: bool = False,
        save_last: bool | Literal["link"] | None = None,
        save_top_k: int = 1,
        save_on_exception: bool = False,
        save_weights_only: bool = False,
        mode: Literal["min", "max"] = "min",
        auto_insert_metric_name: bool = True,
        enable_version_counter: bool = True,
    ) -> None:
        check_least("every_n_rollouts", every_n_rollouts, 1)
        if filename is None:
            # auto_insert_metric_name turns "{rollout}" into "rollout={rollout}"
            filename = "{rollout}" if auto_insert_metric_name else "rollout={rollout}"
        # ModelCheckpoint's arguments as given (filename filled); 0 (not None) disables its own triggers
        checkpoint_args = {k: v for k, v in locals().items() if k not in ("self", "__class__", "every_n_rollouts")}
        super().__init__(**checkpoint_args, every_n_train_steps=0, every_n_epochs=0)
        self.every_n_rollouts = every_n_rollouts
        self._last_rollout_saved = 0

    @property
    def state_key(self) -> str:
        """Distinguishes several RolloutCheckpoints of one run in the checkpoint's callback states."""
        return self._generate_state_key(monitor=self.monitor, mode=self.mode, every_n_rollouts=self.every_n_rollouts)

    # ------------------------------------------------------------------------------------ hooks
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Refuse modules without a rollout count; then :meth:`Checkpoint.setup`."""
        if not isinstance(getattr(pl_module, ROLLOUT_ATTRIBUTE, None), int):
            raise TypeError(
                f"RolloutCheckpoint needs a module with an integer `{ROLLOUT_ATTRIBUTE}` (the "
                f"number of finished rollouts, as PPOModule has); {type(pl_module).__name__} has "
                "none: use rlhf_lit.callbacks.Checkpoint for it"
            )
        super().setup(trainer, pl_module, stage)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Start counting from the module's rollout count (not 0 when resumed)."""
        super().on_train_start(trainer, pl_module)
        self._last_rollout_saved = getattr(pl_module, ROLLOUT_ATTRIBUTE)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Save (top-k and last) after every ``every_n_rollouts``-th finished rollout."""
        rollout = getattr(pl_module, ROLLOUT_ATTRIBUTE)
        # the step after the last rollout (PPO only sets should_stop) finishes no rollout
        if rollout == self._last_rollout_saved or rollout % self.every_n_rollouts != 0:
            return
        if trainer.fast_dev_run or trainer.state.fn != TrainerFn.FITTING or trainer.sanity_checking:
            return
        candidates = self._monitor_candidates(trainer)
        self._save_topk_checkpoint(trainer, candidates)
        self._save_last_checkpoint(trainer, candidates)
        self._last_rollout_saved = rollout

    def _final_state_saved(self, trainer: Trainer) -> bool:
        """Counted in rollouts: a skipped rollout (non-finite values) takes no optimizer step but
        still moves the data position and the schedules."""
        return bool(self._last_checkpoint_saved) and self._last_rollout_saved == getattr(
            trainer.lightning_module, ROLLOUT_ATTRIBUTE
        )

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Nothing: checkpoints follow rollouts, not epochs."""

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Nothing: checkpoints follow rollouts, not validation runs."""

    # ------------------------------------------------------------------------- naming
    def _monitor_candidates(self, trainer: Trainer) -> dict[str, torch.Tensor]:
        """Lightning's candidates (logged metrics, ``epoch``, ``step``) plus ``rollout``."""
        candidates = super()._monitor_candidates(trainer)
        candidates[self.ROLLOUT_KEY] = torch.tensor(getattr(trainer.lightning_module, ROLLOUT_ATTRIBUTE))
        return candidates

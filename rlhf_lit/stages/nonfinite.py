"""Non-finite scores, losses and gradients: skip the update, log it, stop after too many in a row.

One NaN reward turns every weight into NaN in a single update; the next checkpoint then saves
them and the run dies later somewhere that never mentions the reward. Here each optimizer step
first checks its gradients (one device-to-host read per step; a NaN loss gives NaN gradients, so
this covers losses too) and drops them when any is NaN or inf: AdamW skips parameters without a
gradient, so the step changes nothing, its moments included. PPO also checks each rollout's
scores, logprobs and values before updating on them. After ``max_skipped_updates`` skips in a row
the run stops with :class:`NonFiniteError`, and no checkpoint or export is ever written with
non-finite weights (:func:`assert_finite`).

fp16 (``16-mixed``: a GradScaler multiplies the loss by its scale) differs in one way. The scaler
itself skips a step whose gradients overflow and halves its scale; PyTorch's documentation expects
this "for the first few iterations as its value calibrates" (the scale starts at 2^16). Such a
skip is logged and counted in the total, but does not count toward ``max_skipped_updates`` while
it can be the calibration: the losses of the step were finite and the scale above 1. A skip whose
loss was NaN or inf (as a NaN reward or a diverged model gives), or that overflowed at a scale of
1 or below (the gradients themselves do not fit in fp16), counts as a non-finite update does in
32-bit, so the run stops after ``max_skipped_updates`` of them. The scaler's own skip is kept: the
gradients are not dropped (it has already seen their overflow).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from rlhf_lit.models.sharding import any_rank, local_tensor
from rlhf_lit.option_values import check_least

log = logging.getLogger(__name__)


class NonFiniteError(RuntimeError):
    """Too many updates in a row were skipped for NaN or inf, or weights to be written are not finite."""


def nonfinite_names(named: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    """The names of the floating tensors (this rank's shards, when sharded) that hold NaN or inf."""
    return [name for name, t in named if t.is_floating_point() and not bool(torch.isfinite(local_tensor(t)).all())]


def assert_finite(model: torch.nn.Module | Mapping[str, torch.Tensor], what: str) -> None:
    """Raise :class:`NonFiniteError` when a floating parameter or buffer of ``model`` (a module or a
    state dict) holds NaN or inf.

    For a sharded model every rank checks its shards and the verdict is shared (a collective:
    call it on every rank), so all ranks raise together.
    """
    if isinstance(model, Mapping):
        named = list(model.items())
    else:
        named = list(itertools.chain(model.named_parameters(), model.named_buffers()))
    bad = nonfinite_names(named)
    if any_rank(bool(bad), [t for _, t in named]):
        more = ", ..." if len(bad) > 3 else ""
        where = ", ".join(bad[:3]) + more if bad else "on another rank"
        raise NonFiniteError(f"{what} holds non-finite weights ({where}); not written")


def gradients_finite(optimizer: torch.optim.Optimizer) -> bool:
    """Whether every gradient of ``optimizer``'s parameters is finite (one host read).

    Sharded gradients (FSDP) are checked shard by shard and the verdict is shared over the ranks,
    so every rank skips the same steps and the shards stay one model.
    """
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if not grads:
        return True
    # Norms in float32: a finite fp16 gradient whose norm exceeds 65504 is not a NaN.
    norms = torch._foreach_norm([local_tensor(g) for g in grads], 2, dtype=torch.float32)
    finite = bool(torch.isfinite(torch.stack(norms)).all())
    return not any_rank(not finite, grads)


def drop_gradients(optimizer: torch.optim.Optimizer) -> None:
    """Set every gradient of ``optimizer`` to None: its next ``step()`` changes nothing."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = None


class NonFiniteGuard:
    """Counts consecutive skipped updates of each kind and stops the run after ``limit`` in a row.

    Kinds are counted apart (``"rollout"``, ``"optimizer 0"``, ``"optimizer 1"``): a critic whose
    gradients are NaN at every step is stopped even while the policy's steps are fine.

    Args:
        limit: skipped updates of one kind in a row that stop the run (>= 1).
        option: the setting that sets ``limit``, named in the message.
    """

    def __init__(self, limit: int, option: str) -> None:
        check_least(option, limit, 1)
        self.limit, self.option = limit, option
        self.consecutive: dict[str, int] = {}
        self.total = 0
        # fp16 only: whether every loss backpropagated into the gradients about to be stepped was
        # finite (a device tensor: no host read unless a step is skipped), and whether an optimizer
        # has been checked since the last loss (the next loss then starts a new step's record).
        self._losses_finite: torch.Tensor | None = None
        self._checked_since_loss = True

    def skipped(self, kind: str, what: str) -> None:
        """Record a skipped update of ``kind`` (``what`` says which and why); raise after ``limit`` in a row."""
        count = self.consecutive[kind] = self.consecutive.get(kind, 0) + 1
        self.total += 1
        log.warning("skipped an update: %s (%d in a row, %d in all)", what, count, self.total)
        if count >= self.limit:
            raise NonFiniteError(
                f"stopping: {count} updates in a row skipped for non-finite values; the last: {what} "
                f"({self.option}={self.limit}). Check the reward model or reward function, the learning rate "
                "and the precision"
            )

    def passed(self, kind: str) -> None:
        """Record a finite update of ``kind``: its run of skips is over."""
        self.consecutive[kind] = 0

    def note_loss(self, loss: torch.Tensor) -> None:
        """Record whether ``loss``, about to be backpropagated, is finite (fp16 steps read it; see the
        module docstring). The losses of one step (gradient accumulation) are AND-ed; the first loss
        after an optimizer check starts the next step's record."""
        finite = torch.isfinite(loss.detach()).all()  # () bool, on the loss's device
        if self._checked_since_loss or self._losses_finite is None:
            self._losses_finite, self._checked_since_loss = finite, False
        else:
            self._losses_finite = self._losses_finite & finite

    def check_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        kind: str,
        where: str,
        loss_scale: float | None = None,
        any_rank: Callable[[bool], bool] = lambda flag: flag,
    ) -> bool:
        """Whether ``optimizer``'s gradients are finite; when not, the step is skipped and counted.

        Args:
            optimizer: checked after its gradients are complete (and unscaled, under fp16).
            kind: what it trains, for counting and messages (e.g. ``"the critic"``).
            where: the step, for messages.
            loss_scale: the GradScaler's scale the gradients were computed with (fp16); None without
                one: then non-finite gradients are dropped, so the step changes nothing.
            any_rank: ``flag`` OR-ed over the processes (a collective; called on every rank, only
                when the gradients, which every rank shares, are not finite).
        """
        self._checked_since_loss = True
        if gradients_finite(optimizer):
            self.passed(kind)
            return True
        if loss_scale is None:
            drop_gradients(optimizer)
            self.skipped(kind, f"non-finite gradients of {kind} at {where}")
            return False
        # fp16: the scaler found the overflow while unscaling and skips the step itself.
        losses_finite = not any_rank(self._losses_finite is not None and not bool(self._losses_finite))
        what = f"non-finite gradients of {kind} at {where}, skipped by the fp16 GradScaler at loss scale {loss_scale:g}"
        if losses_finite and loss_scale > 1:  # the scaler's calibration (module docstring)
            self.total += 1
            log.info(
                "skipped an update: %s; not counted toward %s (a finite loss, a scale above 1: the scaler "
                "lowers it) (%d in all)",
                what,
                self.option,
                self.total,
            )
            return False
        self.skipped(kind, what if losses_finite else f"{what}; the loss was not finite")
        return False

    def state_dict(self) -> dict[str, Any]:
        """The counters, for checkpoints."""
        return {"consecutive": dict(self.consecutive), "total": self.total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.consecutive = {str(k): int(v) for k, v in state["consecutive"].items()}
        self.total = int(state["total"])

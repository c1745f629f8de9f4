"""Non-finite scores, losses and gradients: skip the update, log it, stop after too many in a row.

One NaN reward turns every weight into NaN in a single update; the next checkpoint then saves
them and the run dies later somewhere that never mentions the reward. Here each optimizer step
first checks its gradients (one device-to-host read per step; a NaN loss gives NaN gradients, so
this covers losses too) and drops them when any is NaN or inf: AdamW skips parameters without a
gradient, so the step changes nothing, its moments included. With fp16 (a gradient scaler) the
scaler already skips such steps as part of its loss scaling and nothing is counted here. PPO also
checks each rollout's scores, logprobs and values before updating on them. After
``max_skipped_updates`` skips in a row the run stops with :class:`NonFiniteError`, and no
checkpoint or export is ever written with non-finite weights (:func:`assert_finite`).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from rlhf_lit.models.sharding import any_rank, local_tensor

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
        if limit < 1:
            raise ValueError(f"{option} must be >= 1, got {limit}")
        self.limit, self.option = limit, option
        self.consecutive: dict[str, int] = {}
        self.total = 0

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

    def check_optimizer(self, optimizer: torch.optim.Optimizer, kind: str, has_scaler: bool, where: str) -> bool:
        """Drop ``optimizer``'s gradients and count a skip when any is not finite; True when they are."""
        if has_scaler:  # fp16: the GradScaler skips inf steps itself, as part of finding its scale
            return True
        if gradients_finite(optimizer):
            self.passed(kind)
            return True
        drop_gradients(optimizer)
        self.skipped(kind, f"non-finite gradients of {kind} at {where}")
        return False

    def state_dict(self) -> dict[str, Any]:
        """The counters, for checkpoints."""
        return {"consecutive": dict(self.consecutive), "total": self.total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.consecutive = {str(k): int(v) for k, v in state["consecutive"].items()}
        self.total = int(state["total"])

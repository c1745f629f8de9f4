"""fp16's GradScaler as the stages see it: its scale (:func:`loss_scale`, None without one: read
by the non-finite guard), and one loss-scale update per optimizer step of PPO's two optimizers
(fp16 with a separate critic).

Lightning's ``MixedPrecision`` plugin calls ``scaler.step(optimizer)`` and then ``scaler.update()``
inside every ``optimizer.step()``. PPO with a separate critic steps two optimizers on gradients
of one backward pass, scaled with one loss scale. If the scale changes at the policy's step (it
grows after ``growth_interval`` clean steps, or shrinks after an overflow), the critic's
gradients are then unscaled with a scale they were not scaled with (measured: the critic's
gradient halved, the scale growing twice per iteration). PyTorch's documented pattern for
several optimizers is ``scaler.step(a); scaler.step(b); scaler.update()``: :func:`one_scaler_update`
restores it around the optimizer steps.

:func:`warn_if_slow_precision` says once when a 16-bit precision runs on a CPU that has no matrix
unit for it (it is then emulated, and slower than ``32-true``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

from lightning.pytorch import Trainer
from lightning.pytorch.accelerators import CPUAccelerator

log = logging.getLogger(__name__)

MATRIX_UNIT_FLAGS = {"bf16": "amx_bf16", "16": "amx_fp16"}
"""The ``/proc/cpuinfo`` flag of the CPU matrix unit (Intel AMX) that runs each 16-bit precision natively,
keyed by the precision's prefix (``bf16-mixed``, ``16-mixed``)."""


def loss_scale(trainer: Trainer) -> float | None:
    """The GradScaler's current scale (fp16 ``16-mixed``): what the loss of this step was multiplied
    by, until ``scaler.update()`` after the optimizer steps; None without a scaler (fp32, bf16)."""
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    return None if scaler is None else float(scaler.get_scale())


@contextmanager
def one_scaler_update(trainer: Trainer) -> Iterator[None]:
    """Defer the precision plugin's ``scaler.update()`` calls in the block to one call at its end.

    A no-op without a gradient scaler (fp32, bf16). Inside the block every ``scaler.update()`` does
    nothing; after it, the scale is updated once from the inf checks of every optimizer stepped in
    the block (a step skipped for inf gradients still shrinks the scale, once).
    """
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    if scaler is None:
        yield
        return
    scaler.update = _no_update  # an instance attribute shadows the method for this block only
    try:
        yield
    finally:
        del scaler.update
    scaler.update()


def _no_update(new_scale=None) -> None:
    """Stands in for ``GradScaler.update`` while the optimizers of one iteration step."""


@cache
def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str] | None:
    """The CPU's feature flags as Linux lists them, or None where the file cannot be read."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return None


_warned = False


def warn_if_slow_precision(trainer: Trainer) -> None:
    """Warn once per process, in one line, when a 16-bit precision runs on a CPU without its matrix unit.

    Without one (``amx_bf16`` for bf16, ``amx_fp16`` for fp16) the CPU emulates 16-bit matrix products:
    mixed precision then only adds casts. Where the flags cannot be read nothing is said. It changes
    nothing; the user decides.
    """
    global _warned
    precision = str(trainer.precision)
    flag = next((f for prefix, f in MATRIX_UNIT_FLAGS.items() if precision.startswith(prefix)), None)
    flags = cpu_flags()
    if _warned or flag is None or not isinstance(trainer.accelerator, CPUAccelerator) or flags is None:
        return
    if flag in flags:
        return
    _warned = True
    log.warning(
        "precision %s on a CPU without %s (no matrix unit for it) is emulated and no faster than 32-true; "
        "use --trainer.precision 32-true on this CPU",
        precision,
        flag,
    )

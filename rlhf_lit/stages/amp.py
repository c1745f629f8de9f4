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
unit for it (it is then emulated, and slower than ``32-true``; the CPU's flags are read by
:mod:`rlhf_lit.models.precision`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from lightning.pytorch import Trainer
from lightning.pytorch.accelerators import CPUAccelerator

from rlhf_lit.models.precision import warn_once_if_slow


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


def warn_if_slow_precision(trainer: Trainer) -> None:
    """Warn once per process, in one line, when a 16-bit precision runs on a CPU without the instructions for it.

    Without them (``amx_bf16`` or ``avx512_bf16`` for bf16, ``amx_fp16`` for fp16) the CPU emulates 16-bit
    matrix products: mixed precision then only adds casts (:func:`rlhf_lit.models.precision.slow_precision_message`, the
    sentence sampling's ``--precision`` says too). Where the flags cannot be read nothing is said. It changes
    nothing; the user decides.
    """
    if isinstance(trainer.accelerator, CPUAccelerator):
        warn_once_if_slow(str(trainer.precision), "--trainer.precision")

"""A warning when the Trainer's precision is slower than float32 on the device it runs on."""

from __future__ import annotations

import logging

import lightning.pytorch as pl
from lightning.pytorch.accelerators import CPUAccelerator

log = logging.getLogger(__name__)

CPU_SLOWDOWN = (
    "bf16-mixed took 2.0x the time of 32-true on the offline PPO config (2.92 vs 1.49 s/rollout, +73 MiB "
    "peak RSS) and 1.06x at 25M parameters (bench/memory.py, 2-core development CPU)"
)
"""How ``bf16-mixed`` compared with ``32-true`` on a CPU, and where it was measured (``bench/memory.py``,
variants ``full (32-true)`` and ``bf16-mixed precision``, at commit 2166731)."""

_warned = False


def warn_if_slow_precision(trainer: pl.Trainer) -> None:
    """Warn once per process, in one line, when a 16-bit precision runs on a CPU accelerator.

    CPUs without native bfloat16 matrix units emulate it: mixed precision then only adds casts.
    Called by every stage in ``on_fit_start``; it changes nothing, the user decides.
    """
    global _warned
    precision = str(trainer.precision)
    if _warned or not isinstance(trainer.accelerator, CPUAccelerator) or precision.startswith(("32", "64")):
        return
    _warned = True
    log.warning("precision %s on a CPU is no faster than 32-true (%s); use --trainer.precision 32-true on CPUs",
                precision, CPU_SLOWDOWN)

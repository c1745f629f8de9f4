"""A warning when the Trainer's precision is slower than float32 on the device it runs on."""

from __future__ import annotations

import logging

import lightning.pytorch as pl
from lightning.pytorch.accelerators import CPUAccelerator

log = logging.getLogger(__name__)

CPU_SLOWDOWN = (
    "no faster (1.0x: 4.85 vs 4.80 s/rollout) and +72 MiB peak RSS on the offline PPO config "
    "(bench/memory.py, 2-core CPU under load); ~2.6x slower in the measurement of issue 10"
)
"""How ``bf16-mixed`` was than ``32-true`` on a CPU, and where it was measured
(``bench/memory.py``, variants ``full`` and ``bf16_mixed``)."""

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
    log.warning("[rlhf-lit] precision %s on CPU is no faster than 32-true: %s; use --trainer.precision 32-true on CPUs",
                precision, CPU_SLOWDOWN)

"""16-bit precision on this machine: the CPU's 16-bit instructions, and the precision sampling runs at.

A CPU multiplies bf16 (fp16) matrices natively only with instructions for them: a matrix unit (Intel
AMX: ``amx_bf16`` / ``amx_fp16`` in ``/proc/cpuinfo``) or, for bf16, AVX-512's bf16 dot products
(``avx512_bf16``: Intel Cooper Lake, AMD Zen 4 and later); without them the products are emulated and a
16-bit precision only adds casts. :func:`cpu_flags` is the one reader of those flags, and
:func:`slow_precision_message` the one sentence saying so, for training
(:func:`rlhf_lit.stages.amp.warn_if_slow_precision`, ``--trainer.precision``) and for sampling
(:func:`sampling_precision`, ``--precision``).

:data:`SamplingPrecision` is how ``rlhf-lit evaluate``, ``rlhf-lit best-of-n`` and the demo's labeller
sample: ``32-true`` as the weights are, or ``bf16-mixed`` under ``torch.autocast`` (Lightning's words,
those of ``trainer.precision``). Only sampling runs under it; what scores the samples stays in
float32 (its callers say why).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Literal, get_args

import torch

from rlhf_lit.option_values import check_choice

log = logging.getLogger(__name__)

NATIVE_16BIT_FLAGS = {"bf16": ("amx_bf16", "avx512_bf16"), "16": ("amx_fp16",)}
"""The ``/proc/cpuinfo`` flags of the instructions that multiply each 16-bit precision natively, any one
of which suffices, keyed by the precision's prefix (``bf16-mixed``, ``16-mixed``). ``avx512_bf16``
counts: on a 2-core AMD EPYC with it and without AMX, bf16 autocast sampled SmolLM2-135M 2.1x faster than
float32 (docs/DEMO-CHAT.md, Speed levers)."""

SamplingPrecision = Literal["32-true", "bf16-mixed"]
"""How a policy samples outside training: float32 (``32-true``), or under bf16 autocast (``bf16-mixed``)."""


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


def _native_flags(precision: str) -> tuple[str, ...] | None:
    """The flags that make ``precision`` native (:data:`NATIVE_16BIT_FLAGS`), None for a 32-bit precision."""
    return next((f for prefix, f in NATIVE_16BIT_FLAGS.items() if str(precision).startswith(prefix)), None)


def slow_precision_message(precision: str, option: str) -> str | None:
    """One line saying that ``precision`` (given as ``option``) is emulated on this CPU, which lacks the
    instructions for it; None for a 32-bit precision, on a CPU that has them, or where the flags cannot be read.

    The caller decides that the precision runs on the CPU (a GPU has its own bf16 units).
    """
    native, flags = _native_flags(precision), cpu_flags()
    if native is None or flags is None or not flags.isdisjoint(native):
        return None
    return (
        f"{option} {precision} on a CPU without {' or '.join(native)} (no instructions for it) is emulated and "
        f"no faster than 32-true; use {option} 32-true on this CPU"
    )


def has_native(precision: str) -> bool:
    """Whether this CPU multiplies ``precision``'s 16-bit type natively (:data:`NATIVE_16BIT_FLAGS`); False for
    a 32-bit precision or where the flags cannot be read."""
    native, flags = _native_flags(precision), cpu_flags()
    return native is not None and flags is not None and not flags.isdisjoint(native)


_warned: set[str] = set()
"""The options already warned about in this process (:func:`warn_once_if_slow`)."""


def warn_once_if_slow(precision: str, option: str) -> None:
    """Log :func:`slow_precision_message` once per process and option, as a warning. It changes nothing;
    the user decides."""
    message = slow_precision_message(precision, option)
    if message is not None and option not in _warned:
        _warned.add(option)
        log.warning("%s", message)


@contextmanager
def sampling_precision(precision: SamplingPrecision, device: torch.device | str) -> Iterator[None]:
    """Run the block at ``precision`` on ``device``: under ``torch.autocast(bfloat16)`` for ``bf16-mixed``
    (warning once when the CPU has no bf16 instructions, :func:`warn_once_if_slow`), as it is for ``32-true``."""
    check_choice("precision", precision, get_args(SamplingPrecision))
    if precision == "32-true":
        yield
        return
    device_type = torch.device(device).type
    if device_type == "cpu":
        warn_once_if_slow(precision, "--precision")
    with torch.autocast(device_type, dtype=torch.bfloat16):
        yield

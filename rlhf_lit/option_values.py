"""The one error for an option set to a value it does not take: none of its choices (a typed ``Literal``
checked where it is read), a number below its least value, or a NaN or infinity where a finite number is meant."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def check_choice(name: str, value: Any, choices: Sequence[str]) -> None:
    """Raise ``ValueError`` ``<name> must be one of <choices>; got <value>`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def check_least(name: str, value: Any, least: int, *, strict: bool = False) -> None:
    """Raise ``ValueError`` ``<name> must be >= <least>, got <value>`` (``> <least>`` when ``strict``) unless
    ``value`` is (NaN never is)."""
    if not (value > least if strict else value >= least):
        raise ValueError(f"{name} must be {'>' if strict else '>='} {least}, got {value}")


SEEDS = (-(2**63), 2**63 - 1)
"""The seeds an option takes: torch's generator takes 64 bits, and the epoch or pass a sampler adds must fit."""


def check_seed(name: str, value: int) -> None:
    """Raise ``ValueError`` ``<name> must be in [...]`` for a seed outside :data:`SEEDS`, which torch answers with
    "Overflow when unpacking long long" when the first batch is drawn, naming nothing."""
    if not SEEDS[0] <= value <= SEEDS[1]:
        raise ValueError(f"{name} must be in [{SEEDS[0]}, {SEEDS[1]}], got {value}")


def check_finite(name: str, value: Any) -> None:
    """Raise ``ValueError`` ``<name> must be a finite number, got <value>`` for a NaN or an infinity (YAML's
    ``.nan``, ``.inf``), which would make every score or loss they enter non-finite."""
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")

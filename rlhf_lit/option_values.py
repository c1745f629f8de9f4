"""The one error for an option set to a value it does not take: none of its choices (a typed ``Literal``
checked where it is read), or a number below its least value."""

from __future__ import annotations

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

"""The one error for an option set to none of its choices (a typed ``Literal`` checked where it is read)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def check_choice(name: str, value: Any, choices: Sequence[str]) -> None:
    """Raise ``ValueError`` ``<name> must be one of <choices>; got <value>`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")

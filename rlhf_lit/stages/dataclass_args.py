"""Nested config dataclasses as stage constructor arguments.

LightningCLI passes the dataclass; ``load_from_checkpoint`` passes back the plain dict stored in
the hyperparameters (a dataclass there would break ``weights_only`` loading). Stages accept both.
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def as_config(cls: type[T], value: T | dict) -> T:
    """Accept a config dataclass or its ``asdict`` form; anything else is a TypeError."""
    if isinstance(value, cls):
        return value
    if isinstance(value, dict):
        return cls(**value)
    raise TypeError(f"expected {cls.__name__} or a dict of its fields, got {type(value).__name__}")

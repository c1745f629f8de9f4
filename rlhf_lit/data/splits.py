"""Seeded train/validation split of a list of examples."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import torch

T = TypeVar("T")


def split_by_fraction(items: Sequence[T], fraction: float, seed: int) -> tuple[list[T], list[T]]:
    """``(train, val)``: ``round(fraction * len(items))`` items drawn by a permutation seeded
    with ``seed`` go to val, the rest to train; both keep the original order.

    Raises:
        ValueError: when either side would be empty.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {fraction}")
    n_val = round(fraction * len(items))
    if n_val == 0 or n_val == len(items):
        raise ValueError(
            f"val_fraction={fraction} of {len(items)} examples gives {n_val} validation and "
            f"{len(items) - n_val} training examples; both must be at least 1"
        )
    perm = torch.randperm(len(items), generator=torch.Generator().manual_seed(seed))
    in_val = set(perm[:n_val].tolist())
    train = [x for i, x in enumerate(items) if i not in in_val]
    val = [x for i, x in enumerate(items) if i in in_val]
    return train, val

"""Seeded train/validation split of a source's examples, drawn by record position."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import torch

T = TypeVar("T")


def split_by_fraction(
    items: Sequence[T],
    fraction: float,
    seed: int,
    *,
    positions: Sequence[int] | None = None,
    records: int | None = None,
) -> tuple[list[T], list[T]]:
    """``(train, val)``: ``round(fraction * records)`` record positions drawn by a permutation of
    ``range(records)`` seeded with ``seed`` are held out; the items of those records go to val, the rest to
    train, both in the original order.

    ``positions``: each item's record, its position among the ``records`` the source holds (the records a
    format left out counted; :class:`~rlhf_lit.data.reading.SourceExamples`). The draw depends only on
    ``records``, ``fraction`` and ``seed``, so two data modules reading one file hold out the same records
    whatever each one's format leaves out. None: each item is its own record (``range(len(items))``).

    Raises:
        ValueError: when either side would be empty.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {fraction}")
    if positions is None:
        positions = range(len(items))
    n = len(items) if records is None else records
    if len(positions) != len(items) or any(not 0 <= p < n for p in positions):
        raise ValueError(f"positions must give each of the {len(items)} items a record in [0, {n})")
    n_val = round(fraction * n)
    if n_val == 0 or n_val == n:
        raise ValueError(
            f"val_fraction={fraction} of {n} records gives {n_val} validation and "
            f"{n - n_val} training records; both must be at least 1"
        )
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    held_out = set(perm[:n_val].tolist())
    train = [x for x, p in zip(items, positions) if p not in held_out]
    val = [x for x, p in zip(items, positions) if p in held_out]
    if not train or not val:
        raise ValueError(
            f"val_fraction={fraction} holds out {n_val} of {n} records, which give {len(val)} validation and "
            f"{len(train)} training examples (the format leaves out the other records); both must be at least 1"
        )
    return train, val

"""Sums over the processes of a data-parallel PPO run, as the reducers the pure math takes.

:mod:`rlhf_lit.functional` stays torch-only: a statistic over every process takes a
:data:`~rlhf_lit.functional.Reducer` (a tensor in, its sum over the processes out). This module
builds them from the Trainer's strategy (``strategy.reduce``: an all-reduce under ddp and fsdp,
the tensor itself on one device), and picks the whitening's by ``ppo.whiten_scope``.
"""

from __future__ import annotations

import torch

from rlhf_lit.functional import Reducer
from rlhf_lit.stages.ppo.config import WhitenScope


def sum_over_ranks(trainer) -> Reducer:
    """A reducer summing a tensor over every process of ``trainer`` (a copy: its argument is kept).

    Every process must call it at the same point (it is a collective under ddp and fsdp).
    """

    def reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
        return trainer.strategy.reduce(tensor.clone(), reduce_op="sum")  # Lightning's reduce is in place

    return reduce_sum


def whitening_reducer(scope: WhitenScope, trainer) -> Reducer | None:
    """What the whitening statistics are summed with (:data:`~rlhf_lit.stages.ppo.config.WhitenScope`):
    every process's rows (``global``) or this process's alone (``rank``, or no trainer: None)."""
    if scope == "rank" or trainer is None:
        return None
    return sum_over_ranks(trainer)

"""Samplers: a deterministic, resumable sampler for the training loaders, and a per-pass
shuffling sampler for the PPO-ptx loader (:class:`PassSampler`).

:class:`ResumableSampler`: each epoch is a permutation of ``range(dataset_size)`` (or the identity
when ``shuffle=False``), drawn as its ``order`` (:data:`ShuffleOrder`) says: ``seed_per_epoch``
(seeded with ``seed + epoch``; the PPO prompts) or ``dataloader`` (the order Lightning took from
a ``DataLoader(shuffle=True, generator=torch.Generator().manual_seed(seed))`` in one process; SFT,
reward model and DPO, whose runs kept that order when they became resumable). The sampler
keeps how many samples of the current epoch were *consumed*; an iteration yields the permutation
from that point, so a run restored from ``state_dict()`` continues with exactly the samples it had
not used, in the same order.

Consumption is reported by the consumer through :meth:`ResumableSampler.mark_consumed` (the
prompt data module's ``mark_consumed``), not counted by the sampler as it yields: the DataLoader
(and Lightning's data fetcher) prefetch batches, so what the sampler has yielded runs ahead of
what training has used.

Several processes (DDP): the count is global (all ranks' prompts; every rank reports the same
number) and each rank takes every ``num_replicas``-th sample of the remaining order from its
``rank``, so one step of all ranks uses one contiguous block of the order and a resume (even with
another number of ranks) continues exactly. It subclasses ``DistributedSampler`` only so that
Lightning uses it as it is instead of wrapping it in a sampler that would reshuffle.

Lightning calls ``set_epoch(epoch)`` at the start of every epoch: a new epoch resets the count,
the same epoch (a run resumed mid-epoch) keeps it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch.utils.data import Sampler
from torch.utils.data.distributed import DistributedSampler

from rlhf_lit.option_values import check_least

ShuffleOrder = Literal["seed_per_epoch", "dataloader"]
"""How :class:`ResumableSampler` permutes an epoch: :func:`seed_per_epoch_order` or :func:`dataloader_order`."""


def seed_per_epoch_order(size: int, seed: int, epoch: int, batch_size: int) -> list[int]:
    """``randperm(size)`` seeded with ``seed + epoch`` (``batch_size`` plays no part)."""
    return torch.randperm(size, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


def dataloader_order(size: int, seed: int, epoch: int, batch_size: int) -> list[int]:
    """The order of epoch ``epoch`` that Lightning's training loop took from
    ``DataLoader(dataset, batch_size, shuffle=True, generator=g)`` with ``g`` seeded with ``seed``,
    in one process without workers.

    Such a loader draws everything from ``g``, one epoch after the other: the iterator's base seed
    (one int64), then RandomSampler's permutation, then, only when the batch sampler reads the
    sampler to its end (to fill a last, smaller batch: Lightning asks for no batch past the
    loader's length), a second permutation of which RandomSampler keeps nothing. Replayed here
    from the seed, so the order of any epoch is known without iterating the ones before it.
    """
    g = torch.Generator().manual_seed(seed)
    order: list[int] = []
    for _ in range(epoch + 1):
        torch.empty((), dtype=torch.int64).random_(generator=g)  # the DataLoader iterator's base seed
        order = torch.randperm(size, generator=g).tolist()
        if size % batch_size:
            torch.randperm(size, generator=g)  # RandomSampler's trailing draw, of which it keeps nothing
    return order


ORDERS: dict[ShuffleOrder, Callable[[int, int, int, int], list[int]]] = {
    "seed_per_epoch": seed_per_epoch_order,
    "dataloader": dataloader_order,
}
"""The function behind each :data:`ShuffleOrder`: ``(size, seed, epoch, batch_size) -> permutation``."""


def _world(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """``(num_replicas, rank)``: each as given, or the process group's (one process without one)."""
    world, this_rank = (
        (dist.get_world_size(), dist.get_rank()) if dist.is_available() and dist.is_initialized() else (1, 0)
    )
    return world if num_replicas is None else num_replicas, this_rank if rank is None else rank


class ResumableSampler(DistributedSampler):
    """Seeded permutation per epoch, resumable mid-epoch, sharded over ranks.

    Args:
        dataset_size: the dataset length.
        shuffle: permute each epoch (else the dataset order).
        seed: the seed of the permutations.
        order: how epoch ``e`` is permuted (:data:`ShuffleOrder`): ``seed_per_epoch`` (seeded with
            ``seed + e``) or ``dataloader`` (the order of a seeded shuffling ``DataLoader``).
        batch_size: the loader's batch size (the ``dataloader`` order depends on it).
        num_replicas: number of ranks (default: the process group's world size, else 1).
        rank: this rank (default: the process group's rank, else 0).
    """

    def __init__(
        self,
        dataset_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        order: ShuffleOrder = "seed_per_epoch",
        batch_size: int = 1,
        num_replicas: int | None = None,
        rank: int | None = None,
    ):
        if order not in ORDERS:
            raise ValueError(f"order must be one of {sorted(ORDERS)}, got {order!r}")
        check_least("dataset_size", dataset_size, 1)
        num_replicas, rank = _world(num_replicas, rank)
        super().__init__(
            range(dataset_size),  # type: ignore[arg-type]
            num_replicas=num_replicas,
            rank=rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=True,
        )
        self.dataset_size, self.shuffle_order, self.batch_size = dataset_size, order, batch_size
        self.consumed = 0

    def order(self, epoch: int) -> list[int]:
        """All indices of ``epoch`` in the order they are drawn (over all ranks)."""
        if not self.shuffle:
            return list(range(self.dataset_size))
        return ORDERS[self.shuffle_order](self.dataset_size, self.seed, epoch, self.batch_size)

    def __iter__(self) -> Iterator[int]:
        remaining = self.order(self.epoch)[self.consumed :]
        usable = len(remaining) - len(remaining) % self.num_replicas  # ranks stay in step
        return iter(remaining[self.rank : usable : self.num_replicas])

    def __len__(self) -> int:
        # the full epoch, also when resuming mid-epoch: Lightning measures the loader once and
        # would otherwise cut every later epoch short (a resumed epoch just ends early)
        return self.dataset_size // self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.consumed = epoch, 0

    def mark_consumed(self, n: int) -> None:
        """Record that training used ``n`` more samples of the current epoch (all ranks)."""
        if n < 0 or self.consumed + n > self.dataset_size:
            raise ValueError(
                f"cannot mark {n} more samples consumed: {self.consumed} of "
                f"{self.dataset_size} already consumed in epoch {self.epoch}"
            )
        self.consumed += n

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "consumed": self.consumed,
            "dataset_size": self.dataset_size,
            "shuffle": self.shuffle,
            "seed": self.seed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("dataset_size", "shuffle", "seed"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"cannot resume the prompt sampler: the checkpoint has {key}={state[key]!r} "
                    f"but this run has {key}={getattr(self, key)!r} (the data or seed changed)"
                )
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])


class PassSampler(Sampler[int]):
    """A new seeded permutation on every pass, sharded over ranks: for a loader that its consumer
    iterates again and again (the PPO-ptx source, which PPO cycles through).

    Pass ``k`` (the ``k``-th ``iter()`` of this sampler, from 0) draws ``randperm(dataset_size)``
    seeded with ``seed + k``; rank ``r`` takes every ``num_replicas``-th index of it from ``r``,
    the remainder of the division dropped so that every rank yields as many indices. Not
    resumable: a new sampler starts again at pass 0.

    Args:
        dataset_size: the dataset length (at least ``num_replicas``).
        seed: pass ``k`` is seeded with ``seed + k``.
        num_replicas: number of ranks (default: the process group's world size, else 1).
        rank: this rank (default: the process group's rank, else 0).
    """

    def __init__(self, dataset_size: int, *, seed: int = 0, num_replicas: int | None = None, rank: int | None = None):
        self.num_replicas, self.rank = _world(num_replicas, rank)
        if dataset_size < self.num_replicas:
            raise ValueError(f"{dataset_size} examples cannot give each of {self.num_replicas} ranks one")
        self.dataset_size, self.seed = dataset_size, seed
        self.passes = 0  # iterations started so far

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed + self.passes)
        self.passes += 1
        order = torch.randperm(self.dataset_size, generator=g).tolist()
        usable = len(self) * self.num_replicas
        return iter(order[self.rank : usable : self.num_replicas])

    def __len__(self) -> int:
        return self.dataset_size // self.num_replicas

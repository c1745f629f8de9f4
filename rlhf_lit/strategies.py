"""FSDP for the rlhf-lit stages: Lightning's ``ModelParallelStrategy`` sharding with FSDP2, by name.

Every stage shards its own models in ``configure_model`` (:func:`rlhf_lit.models.sharding.shard_models`):
each transformer block and then each whole model is a ``fully_shard`` unit over all processes.
PPO holds four models (policy, reference, reward model, critic) and calls ``generate`` inside its
training step, which Lightning's ``FSDPStrategy`` (FSDP1, one wrapper around the whole
LightningModule) does not support; FSDP2 hooks each model's own forward, so ``generate``, the
no-grad scoring passes and the update all work on the sharded models.

Importing this module registers two strategy names with Lightning:

- ``fsdp2``: :class:`FSDP2Strategy`, on GPUs and on CPUs (gloo; slow, for tests and debugging);
- ``fsdp``: the same strategy, so ``--trainer.strategy fsdp`` works unchanged on GPUs. Lightning's
  ``fsdp`` needs CUDA; so does this name (:func:`check_strategy_choice` stops it on CPU with a
  message naming ``fsdp2``).

Checkpoints are one file with the full (gathered) weights and optimizer states, written by rank 0,
so they resume under any strategy and world size check (:mod:`rlhf_lit.stages.resume`), and the
atomic writes of :mod:`rlhf_lit.callbacks.checkpoint` apply unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.fabric.strategies.model_parallel import _is_sharded_checkpoint, _rekey_optimizer_state_if_needed
from lightning.pytorch.strategies import ModelParallelStrategy, StrategyRegistry
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

from rlhf_lit.stages.resume import check_loaded_keys

CPU_FSDP = "fsdp2"
"""The strategy name of the FSDP path that also runs on CPUs."""


class FSDP2Strategy(ModelParallelStrategy):
    """FSDP2 (``fully_shard``) data parallelism over every process, with full-weight checkpoints.

    Lightning's ``ModelParallelStrategy`` with the data-parallel mesh dimension over all processes
    of all nodes (``--trainer.num_nodes`` x ``--trainer.devices``) and no tensor parallelism; the
    stages apply the sharding (``configure_model``). Checkpoints gather the full state on rank 0
    (``save_distributed_checkpoint=False``). A checkpoint may leave out the frozen models a stage
    reloads from their paths (its ``FROZEN_PREFIXES``); every other weight must be in it.
    """

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("save_distributed_checkpoint", False)
        super().__init__(data_parallel_size="auto", tensor_parallel_size=1, **kwargs)

    def setup_environment(self) -> None:
        """Every process is one data-parallel rank (the parent's ``auto`` would mean one per node)."""
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """Read a full checkpoint on every rank and restore the optimizers' shards from it.

        The model weights are restored later, in :meth:`load_model_state_dict`, after the stage's
        ``on_load_checkpoint`` has compared its settings with the checkpoint's.
        """
        path = Path(self.broadcast(checkpoint_path))
        if _is_sharded_checkpoint(path):  # written by Lightning's ModelParallelStrategy itself
            return super().load_checkpoint(path, weights_only=weights_only)
        checkpoint = torch.load(path, map_location="cpu", weights_only=weights_only)
        options = StateDictOptions(full_state_dict=True)
        for optimizer, state in zip(self.optimizers, checkpoint.get("optimizer_states", [])):
            state = _rekey_optimizer_state_if_needed(state, self.model)
            set_optimizer_state_dict(self.model, optimizer, optim_state_dict=state, options=options)
        return checkpoint

    def load_model_state_dict(self, checkpoint: dict[str, Any], strict: bool = True) -> None:
        """Scatter the full weights of ``checkpoint`` into the shards (every rank slices its own)."""
        if "state_dict" not in checkpoint:  # a sharded checkpoint: loaded in load_checkpoint
            return
        result = set_model_state_dict(
            self.model, checkpoint["state_dict"], options=StateDictOptions(full_state_dict=True, strict=False)
        )
        frozen = getattr(self.lightning_module, "FROZEN_PREFIXES", ())
        check_loaded_keys(result.missing_keys, result.unexpected_keys, frozen, strict)


def check_strategy_choice(strategy: object, accelerator: object) -> None:
    """Stop ``fsdp`` on a CPU-only run with a message naming the CPU path (``fsdp2``).

    Args:
        strategy: ``--trainer.strategy`` as given (a name or an object).
        accelerator: ``--trainer.accelerator`` as given (``auto`` means CUDA when it is available).
    """
    if not isinstance(strategy, str) or strategy.lower() != "fsdp":
        return
    name = str(accelerator).lower() if isinstance(accelerator, str) else type(accelerator).__name__.lower()
    on_gpu = name in ("cuda", "gpu") or "cuda" in name or (name == "auto" and torch.cuda.is_available())
    if not on_gpu:
        raise ValueError(
            f"--trainer.strategy fsdp needs CUDA GPUs (as Lightning's FSDP does), and the accelerator is "
            f"{accelerator!r}; on CPUs use --trainer.strategy {CPU_FSDP} (the same FSDP2 sharding, over gloo)"
        )


def register_strategies() -> None:
    """Register ``fsdp2`` and ``fsdp`` (see the module docstring) with Lightning's strategy registry."""
    description = "rlhf-lit: FSDP2 (fully_shard per transformer block and per model), full-weight checkpoints"
    for name in (CPU_FSDP, "fsdp"):
        StrategyRegistry.register(name, FSDP2Strategy, description=description, override=True)


register_strategies()

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

Checkpoints are one file with the full (gathered) weights and optimizer states, written by rank 0
in the layout of a single-process checkpoint (optimizer states numbered as torch numbers them), so
a checkpoint resumes under another strategy, and the atomic writes of
:mod:`rlhf_lit.callbacks.checkpoint` apply unchanged.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import torch
from jsonargparse import Namespace
from lightning.fabric.strategies.model_parallel import _is_sharded_checkpoint
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.strategies import ModelParallelStrategy, StrategyRegistry
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

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
        """``kwargs``: ``process_group_backend`` and ``timeout`` of Lightning's ``ModelParallelStrategy``."""
        super().__init__(data_parallel_size="auto", tensor_parallel_size=1, save_distributed_checkpoint=False, **kwargs)

    def setup_environment(self) -> None:
        """Every process is one data-parallel rank (the parent's ``auto`` would mean one per node)."""
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()

    @property
    def lightning_restore_optimizer(self) -> bool:
        """Lightning calls :meth:`load_optimizer_state_dict`, after the stage checked its settings."""
        return True

    def _optimizer_names(self, optimizer: torch.optim.Optimizer) -> list[str]:
        """The parameter names of ``optimizer`` in its own order (torch's numbering in a state dict)."""
        names = {id(p): name for name, p in self.model.named_parameters()}
        return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]

    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        """The full state of ``optimizer`` on rank 0 (``{}`` elsewhere), numbered as torch numbers it.

        The same layout a single-process or DDP checkpoint has (parameter i of the optimizer's
        groups), so checkpoints resume across strategies. A collective: every rank calls it.
        """
        if isinstance(optimizer, LightningOptimizer):
            optimizer = optimizer._optimizer
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_optimizer_state_dict(self.model, optimizer, options=options)  # keyed by parameter name
        if not state:
            return state
        index = {name: i for i, name in enumerate(self._optimizer_names(optimizer))}
        return {
            "state": {index[name]: value for name, value in state["state"].items()},
            "param_groups": [{**g, "params": [index[name] for name in g["params"]]} for g in state["param_groups"]],
        }

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """Read a full checkpoint on every rank; weights and optimizer states are restored by
        :meth:`load_model_state_dict` and :meth:`load_optimizer_state_dict`, after the stage's
        ``on_load_checkpoint`` has compared its settings with the checkpoint's."""
        path = Path(self.broadcast(checkpoint_path))
        if _is_sharded_checkpoint(path):
            raise ValueError(
                f"--ckpt_path {path}: a sharded (distributed) checkpoint directory; rlhf-lit writes and resumes "
                "one-file checkpoints"
            )
        return torch.load(path, map_location="cpu", weights_only=weights_only)

    def load_model_state_dict(self, checkpoint: dict[str, Any], strict: bool = True) -> None:
        """Scatter the full weights of ``checkpoint`` into the shards (every rank slices its own)."""
        result = set_model_state_dict(
            self.model, checkpoint["state_dict"], options=StateDictOptions(full_state_dict=True, strict=False)
        )
        frozen = getattr(self.lightning_module, "FROZEN_PREFIXES", ())
        check_loaded_keys(result.missing_keys, result.unexpected_keys, frozen, strict)

    def load_optimizer_state_dict(self, checkpoint: dict[str, Any]) -> None:
        """Scatter each optimizer's full state (torch's numbering, :meth:`optimizer_state`) into its shards."""
        states = checkpoint["optimizer_states"]
        if len(states) != len(self.optimizers):
            raise ValueError(f"the checkpoint holds {len(states)} optimizer states, the run has {len(self.optimizers)}")
        for optimizer, state in zip(self.optimizers, states):
            names = self._optimizer_names(optimizer)
            if len(state["state"]) > len(names) or any(
                len(g["params"]) != len(o["params"]) for g, o in zip(state["param_groups"], optimizer.param_groups)
            ):
                raise ValueError("the checkpoint's optimizer state does not fit the run's parameters")
            named = {
                "state": {names[int(i)]: value for i, value in state["state"].items()},
                "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in state["param_groups"]],
            }
            set_optimizer_state_dict(
                self.model, optimizer, optim_state_dict=named, options=StateDictOptions(full_state_dict=True)
            )


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


def shards_models(strategy: object) -> bool:
    """Whether ``--trainer.strategy`` as given (a registered name, a ``class_path`` config or a strategy
    object) shards the models with FSDP (``fsdp``, ``fsdp2``, Lightning's ``ModelParallelStrategy``
    or ``FSDPStrategy``)."""
    from lightning.pytorch.strategies import FSDPStrategy

    if isinstance(strategy, str):
        entry = StrategyRegistry[strategy.lower()] if strategy.lower() in StrategyRegistry else None
        cls = entry["strategy"] if entry else None
    elif isinstance(strategy, (dict, Namespace)) and strategy.get("class_path"):
        module, _, name = str(strategy.get("class_path")).rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError):
            cls = None  # not ours to report: instantiation names the bad class
    else:
        cls = type(strategy)
    return isinstance(cls, type) and issubclass(cls, (ModelParallelStrategy, FSDPStrategy))


def register_strategies() -> None:
    """Register ``fsdp2`` and ``fsdp`` (see the module docstring) with Lightning's strategy registry."""
    description = "rlhf-lit: FSDP2 (fully_shard per transformer block and per model), full-weight checkpoints"
    for name in (CPU_FSDP, "fsdp"):
        StrategyRegistry.register(name, FSDP2Strategy, description=description, override=True)


register_strategies()

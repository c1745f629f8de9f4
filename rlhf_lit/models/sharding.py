"""Sharding a stage's models with FSDP2 (``fully_shard``), and reading sharded weights back whole.

The stages call :func:`shard_models` from ``configure_model``; it does nothing unless the
Trainer's strategy gives the module a data-parallel device mesh (``fsdp`` / ``fsdp2``, see
:mod:`rlhf_lit.strategies`). Each transformer block (the classes a Hugging Face model lists in
``_no_split_modules``) becomes one ``fully_shard`` unit and then the whole model another, so a
forward pass gathers one block's weights at a time. Frozen models are sharded too: that is where
PPO's memory goes (policy, reference, reward model and critic). Every trained parameter must be
under some unit, or its gradients would not be averaged over the ranks; a module with parameters
and no blocks (a value head) is one unit. A LoRA model is sharded the same way: FSDP2 keeps each
parameter's ``requires_grad``, so a block's frozen base weights and trainable adapters share its
unit, and only the adapters' gradients are reduced (see :mod:`rlhf_lit.models.lora` for the
reference with adapters disabled and the export from gathered weights).

Under FSDP every forward pass is a collective: all ranks must make the same calls in the same
order. Generation keeps the ranks stepping together (``synced_gpus``, :func:`is_sharded`), and
each rank's batch has the same number of rows, so the scoring chunks and minibatches match.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.tensor import DTensor

log = logging.getLogger(__name__)


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model``'s parameters are FSDP2 shards (DTensors)."""
    return any(isinstance(p, DTensor) for p in model.parameters())


def _block_classes(model: nn.Module) -> set[str]:
    """The transformer block class names of every Hugging Face model inside ``model``."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    return names


def shard_model(model: nn.Module, mesh) -> None:
    """``fully_shard`` each transformer block of ``model``, then ``model`` itself, over ``mesh``."""
    from torch.distributed.fsdp import fully_shard

    blocks = _block_classes(model)
    units = [m for m in model.modules() if m is not model and type(m).__name__ in blocks]
    if blocks and not units:
        log.warning("%s names blocks %s but none was found: sharded as one unit", type(model).__name__, sorted(blocks))
    for unit in units:
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)


def shard_models(lightning_module, models: dict[str, nn.Module | None]) -> None:
    """Shard ``models`` (name -> module; None entries skipped) when the strategy gives a device mesh.

    Call from ``configure_model``; a no-op for single-device and DDP runs, and when called again
    (Lightning calls ``configure_model`` once per fit, validate and test).
    """
    from lightning.pytorch.strategies import FSDPStrategy

    trainer = getattr(lightning_module, "_trainer", None)
    if trainer is not None and isinstance(trainer.strategy, FSDPStrategy):
        raise ValueError(
            "Lightning's FSDPStrategy (FSDP1, one wrapper around the whole module) cannot run this stage; "
            "use --trainer.strategy fsdp (rlhf-lit's FSDP2 strategy; fsdp2 on CPUs)"
        )
    mesh = getattr(lightning_module, "_device_mesh", None)
    if mesh is None:
        return
    dp_mesh = mesh["data_parallel"] if mesh.mesh_dim_names else mesh
    for name, model in models.items():
        if model is None or is_sharded(model) or not any(True for _ in model.parameters()):
            continue
        shard_model(model, dp_mesh)
        log.debug("sharded %s over %d processes", name, dp_mesh.size())


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor; any other tensor as it is."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def any_rank(flag: bool, tensors: list[torch.Tensor]) -> bool:
    """``flag`` OR-ed over the ranks that hold shards of ``tensors`` (no collective when none is sharded)."""
    sharded = next((t for t in tensors if isinstance(t, DTensor)), None)
    if sharded is None:
        return flag
    value = torch.tensor([float(flag)], device=sharded.to_local().device)
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX, group=sharded.device_mesh.get_group())
    return bool(value.item() > 0)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """The whole weights of a sharded ``model`` on CPU on rank 0 (``{}`` elsewhere); None if not sharded.

    A collective: every rank must call it.
    """
    if not is_sharded(model):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


@contextlib.contextmanager
def gathered_for_generation(model: nn.Module) -> Iterator[None]:
    """Keep a sharded model's weights gathered between the decoding steps of one ``generate`` call.

    FSDP2 gathers a block's weights before its forward pass and frees them after; decoding makes
    one forward pass per token, so without this every token would gather the whole model again.
    Here the first step gathers and the weights stay until the end of the block (the memory of one
    unsharded copy of the policy while sampling, as DeepSpeed ZeRO-3 and OpenRLHF gather for
    generation). No-op for an unsharded model.
    """
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not units:
        yield
        return
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            # FSDP2's default: the root keeps its weights after forward, every other unit frees them.
            unit.set_reshard_after_forward(unit is not model, recurse=False)


def reshard(model: nn.Module) -> None:
    """Free the gathered weights of a sharded ``model``, so its parameters are the shards again.

    FSDP2 keeps a root unit's weights gathered after a forward pass without backward; an in-place
    change of a parameter then writes into that gathered copy, which the next reshard drops. Call
    this before changing weights in place (folding the reward normalisation). No-op if not sharded.
    """
    from torch.distributed.fsdp import FSDPModule

    for unit in model.modules():
        if isinstance(unit, FSDPModule):
            unit.reshard()

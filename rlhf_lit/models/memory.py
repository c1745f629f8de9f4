"""Memory levers: gradient checkpointing of trained models, and where the frozen models live.

- :func:`enable_gradient_checkpointing`: activations of each transformer block are recomputed in
  the backward pass instead of stored (Chen et al. 2016), for the policy, a separate critic, the
  SFT model and the RM. Hugging Face checkpoints a block only while the model is in train mode,
  and models loaded with ``from_pretrained`` stay in eval mode under Lightning here; the passes
  that back-propagate therefore run under :func:`train_mode` (safe: every dropout is off, see
  :func:`rlhf_lit.models.loading.disable_dropout`), while ``generate`` and the no-grad scoring
  passes stay in eval mode, where the KV cache is kept.
- :class:`MemoryConfig` ``frozen_device`` / ``frozen_dtype``: the frozen reference and reward model in another dtype (e.g. bfloat16)
  and/or on the CPU while the trained models sit on an accelerator. A model on the CPU is kept out
  of the LightningModule's submodules (so the Trainer never moves it) and is called through
  :func:`call_on_own_device`, which moves the inputs there and the results back.
- :func:`release_frozen` and :func:`release_optimizer_states`: at the end of fit, what nobody reads
  afterwards is freed before Lightning's teardown (``Strategy.teardown``: the optimizer states, then
  ``lightning_module.cpu()``) copies it to host memory. A released frozen model keeps its structure
  with its weights on the meta device; calling it raises :class:`ReleasedError`.
  :func:`teardown_bytes` counts what that teardown copies.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any, Literal, TypeVar

import torch
from torch import nn
from transformers import PreTrainedModel

from rlhf_lit.models.loading import DType

FrozenDevice = Literal["same", "cpu"]
"""``same``: the frozen models move with the LightningModule (to the accelerator); ``cpu``: they stay
on the CPU (less accelerator memory, slower scoring)."""

T = TypeVar("T")


@dataclass(frozen=True)
class MemoryConfig:
    """PPO's memory levers (each changes memory and time, not the algorithm).

    Args:
        gradient_checkpointing: recompute the activations of each transformer block of the policy
            and of a separate critic in the backward pass instead of storing them (less activation
            memory, about one extra forward pass of time per update).
        frozen_device: where the frozen reference and reward model live (:data:`FrozenDevice`).
            With LoRA the reference is the policy itself (adapters disabled): this and
            ``frozen_dtype`` then apply to the reward model only.
        frozen_dtype: their weight dtype; None = the module's ``dtype``. ``bfloat16`` halves their
            memory; reference logprobs and scores then differ from float32 in the third decimal.
    """

    gradient_checkpointing: bool = False
    frozen_device: FrozenDevice = "same"
    frozen_dtype: DType | None = None

    def __post_init__(self) -> None:
        if self.frozen_device not in ("same", "cpu"):
            raise ValueError(f"memory.frozen_device must be 'same' or 'cpu', got {self.frozen_device!r}")
        if self.frozen_dtype not in (None, "auto", "float32", "bfloat16", "float16"):
            raise ValueError(
                f"memory.frozen_dtype must be null, auto, float32, bfloat16 or float16, got {self.frozen_dtype!r}"
            )


def enable_gradient_checkpointing(*modules: nn.Module) -> None:
    """Recompute each transformer block's activations in the backward pass, in every Hugging Face
    model among ``modules`` and their submodules (a critic wrapper's value model included; a bare
    value head has none and is skipped).

    Non-reentrant checkpointing: with LoRA the block inputs need no gradient (frozen embeddings),
    which the reentrant variant would take as "nothing to back-propagate" and drop the adapters'
    gradients. Takes effect in train mode only (see the module docstring and :func:`train_mode`).
    """
    for module in modules:
        for model in module.modules():
            if not isinstance(model, PreTrainedModel) or model.base_model is model and model is not module:
                continue  # the trunk inside a task model is switched on with it
            if not model.supports_gradient_checkpointing:
                raise ValueError(f"gradient_checkpointing: {type(model).__name__} does not support it")
            kwargs = {"use_reentrant": False}
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
                model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


@contextmanager
def train_mode(*modules: nn.Module):
    """``modules`` in train mode inside the block, their earlier modes restored after it.

    Train mode is what activates Hugging Face's gradient checkpointing; with dropout off it changes
    no number, so the update passes can always run in it.
    """
    before = [[(m, m.training) for m in module.modules()] for module in modules]
    for module in modules:
        module.train()
    try:
        yield
    finally:
        for saved in before:
            for m, training in saved:
                m.training = training


def attach_frozen(owner: nn.Module, name: str, model: nn.Module, device: FrozenDevice) -> None:
    """Set ``owner.<name> = model``: a registered submodule (moved by the Trainer) for ``same``; for
    ``cpu`` a plain attribute, outside ``owner``'s modules and state dict, so it stays on the CPU."""
    if device == "same":
        setattr(owner, name, model)
    else:
        object.__setattr__(owner, name, model.to("cpu"))


def _moved(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if is_dataclass(value) and not isinstance(value, type):
        return replace(value, **{f.name: _moved(getattr(value, f.name), device) for f in fields(value)})
    return value


def call_on_own_device(fn: Callable[..., T], model: nn.Module, *args: Any) -> T:
    """``fn(model, *args)`` with tensor arguments (also inside dataclasses) moved to ``model``'s device
    and a tensor result moved back to the device of the first tensor argument. A no-op move when
    they already share a device."""
    home = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
    if home is None:
        home = next((getattr(a, f.name).device for a in args if is_dataclass(a) for f in fields(a)), None)
    there = next(model.parameters()).device
    result = fn(model, *(_moved(a, there) for a in args))
    return result.to(home) if isinstance(result, torch.Tensor) and home is not None else result


class ReleasedError(RuntimeError):
    """A frozen model released at the end of fit (:func:`release_frozen`) was called."""


_released: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def is_released(model: nn.Module) -> bool:
    """Whether :func:`release_frozen` released ``model``."""
    return model in _released


def release_frozen(owner: nn.Module, name: str) -> None:
    """Free the weights of the frozen model ``owner.<name>`` (if it has one) when fit no longer needs it.

    In place, so every holder of the model (a reference object, the user) sees the same state: its
    parameters and buffers go to the meta device (shapes, dtypes and ``config`` kept, no storage)
    and calling it raises :class:`ReleasedError`. It stays ``owner.<name>`` as a plain attribute, not
    a submodule: outside ``owner``'s state dict, and never copied by the Trainer (a meta tensor has
    no data to copy). Every rank releases its own copy (no collective). Under FSDP2 the parameters go
    to meta too, but FSDP's own records still hold each rank's local shard; Lightning's
    FSDP2 teardown copies nothing to the host, so only accelerator memory after fit is concerned.
    """
    model = getattr(owner, name, None)
    if not isinstance(model, nn.Module) or is_released(model):
        return
    owner._modules.pop(name, None)
    object.__setattr__(owner, name, model)

    def refuse(module: nn.Module, args: Any) -> None:
        raise ReleasedError(
            f"{type(owner).__name__}.{name} was released at the end of fit to free memory (its weights are on "
            f"the meta device); to use it after fit (trainer.validate, scoring), load the module again: "
            f"{type(owner).__name__}.load_from_checkpoint(<a checkpoint of the run>) reloads it from its path"
        )

    model.register_forward_pre_hook(refuse, prepend=True)  # before FSDP's hooks, which would gather meta shards
    model.to("meta")
    _released.add(model)


def release_optimizer_states(optimizers: Iterable[torch.optim.Optimizer]) -> None:
    """Empty each optimizer's per-parameter state (Adam's moments and step counts); its parameter
    groups and hyperparameters stay. A step after this starts the moments afresh."""
    for optimizer in optimizers:
        optimizer.state.clear()


def _storage_bytes(tensors: Iterable[torch.Tensor], seen: set[tuple[str, int]]) -> int:
    total = 0
    for t in tensors:
        if t.is_meta:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t  # a DTensor: this rank's shard
        storage = local.untyped_storage()
        key = (str(local.device), storage.data_ptr())
        if key not in seen and storage.nbytes() > 0:
            seen.add(key)
            total += storage.nbytes()
    return total


def teardown_bytes(module: nn.Module, optimizers: Iterable[torch.optim.Optimizer]) -> dict[str, int]:
    """The bytes Lightning's ``Strategy.teardown`` copies to the host on an accelerator: ``module``'s
    registered parameters and buffers (``module.cpu()``), each storage once, and every tensor in the
    optimizers' states. ``{"module": ..., "optimizer_states": ...}``; this rank's shards under FSDP."""
    seen: set[tuple[str, int]] = set()
    module_bytes = _storage_bytes(itertools.chain(module.parameters(), module.buffers()), seen)
    states = (v for opt in optimizers for state in opt.state.values() for v in state.values())
    optimizer_bytes = _storage_bytes((v for v in states if isinstance(v, torch.Tensor)), seen)
    return {"module": module_bytes, "optimizer_states": optimizer_bytes}

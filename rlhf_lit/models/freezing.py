"""Training only the top of a model: ``trainable_layers`` of the SFT, reward-model, DPO and PPO stages.

:func:`freeze_lower_layers` leaves the top N transformer blocks trainable, with everything that runs
after them (the final norm, a reward model's score head, a value head, an LM head of its own) and
freezes the rest: every embedding (token and position), whatever runs before the blocks (an
embedding norm, an input projection) and the blocks below. What runs before or after the blocks is
found by running the model once on one token and noting the order its modules are called in, so no
architecture is named here. A frozen parameter has ``requires_grad`` False, so it receives no
gradient and has no optimizer state, and since nothing below the top blocks requires a gradient,
autograd records nothing there: the backward pass stops at the first trainable block (the time saved
is the lower blocks' backward, about two thirds of their cost, and their stored activations).

An LM head tied to the input embeddings (SmolLM2, GPT-2, Llama 3.2 1B) is the embedding matrix itself:
it stays frozen, for training it would send a gradient through every block down to the input
lookup and save nothing.

:func:`freeze_modules` (``frozen_modules``) freezes named modules inside what trains, e.g. the top
block's MLP, whose output goes straight to the LM head: the chat demo measured most of PPO's KL in the
top block, and PPO with that MLP frozen spent its first nats better on one run (docs/DEMO-CHAT.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def transformer_blocks(model: nn.Module) -> nn.ModuleList:
    """The model's stack of transformer blocks: the ``nn.ModuleList`` holding the most parameters
    (``model.layers`` of Llama, ``transformer.h`` of GPT-2, ``gpt_neox.layers``, ...).

    Raises ``ValueError`` when the model has none (``trainable_layers`` needs blocks to count)."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    if not lists:
        raise ValueError(f"trainable_layers: {type(model).__name__} has no stack of transformer blocks to count")
    return max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))


def modules_run_before(model: nn.Module, first: nn.Module) -> list[nn.Module]:
    """The modules with parameters of their own that ``model`` calls before ``first`` in a forward pass
    of one token (found with pre-hooks; the pass runs without gradients)."""
    order: list[nn.Module] = []
    hooks = [
        m.register_forward_pre_hook(lambda module, args: order.append(module))
        for m in model.modules()
        if any(True for _ in m.parameters(recurse=False))
    ]
    hooks.append(first.register_forward_pre_hook(lambda module, args: order.append(first)))
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            one = torch.ones(1, 1, dtype=torch.long, device=device)
            model(input_ids=one, attention_mask=one)
    finally:
        for hook in hooks:
            hook.remove()
    return order[: order.index(first)] if first in order else []


def freeze_lower_layers(model: nn.Module, trainable_layers: int | None) -> nn.Module:
    """Freeze all of ``model`` but its top ``trainable_layers`` blocks and what follows them (see the
    module docstring); None leaves it as it is. Returns the same model.

    Raises ``ValueError`` for a count below 1 or above the model's number of blocks."""
    if trainable_layers is None:
        return model
    blocks = transformer_blocks(model)
    if not 1 <= trainable_layers <= len(blocks):
        raise ValueError(
            f"trainable_layers must be between 1 and the model's {len(blocks)} transformer blocks, got {trainable_layers}"
        )
    for module in modules_run_before(model, blocks[0]):  # an embedding norm, an input projection
        module.requires_grad_(False)
    for block in blocks[: len(blocks) - trainable_layers]:
        block.requires_grad_(False)
    for module in model.modules():
        if isinstance(module, nn.Embedding):  # token and position embeddings (and a head tied to them)
            module.requires_grad_(False)
    return model


def module_matches(name: str, wanted: str) -> bool:
    """Whether the module ``name`` is the one ``wanted`` names: its full name or a dotted suffix of it
    (``layers.29.mlp`` and ``mlp`` both name ``model.layers.29.mlp``; ``lp`` names nothing)."""
    return name == wanted or name.endswith("." + wanted)


def freeze_modules(model: nn.Module, names: Sequence[str] | None) -> nn.Module:
    """Freeze every module of ``model`` that one of ``names`` names (:func:`module_matches`), with its
    submodules: its parameters get ``requires_grad`` False, so no gradient and no optimizer state. None or
    an empty list leaves the model as it is. Returns the same model.

    Raises ``ValueError`` naming ``frozen_modules`` for a name that matches no module of the model, one
    whose parameters are all frozen already (a block below ``trainable_layers``), or when nothing would be
    left to train."""
    if not names:
        return model
    modules = dict(model.named_modules())
    for wanted in names:
        hits = [name for name in modules if name and module_matches(name, wanted)]
        if not hits:
            raise ValueError(
                f"frozen_modules: no module of {type(model).__name__} is named {wanted!r} (a module's full name "
                f"or a dotted suffix of it, e.g. {_example(model)!r})"
            )
        if not any(p.requires_grad for name in hits for p in modules[name].parameters()):
            # e.g. a block below trainable_layers: the option would silently change nothing
            raise ValueError(f"frozen_modules: {wanted!r} names no parameter that trains (already frozen, or none)")
        for name in hits:
            modules[name].requires_grad_(False)
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(f"frozen_modules {list(names)} leaves nothing of {type(model).__name__} to train")
    return model


def _example(model: nn.Module) -> str:
    """A name ``frozen_modules`` would accept for ``model``: its top block's last part (``layers.29.mlp``)."""
    try:
        blocks = transformer_blocks(model)
    except ValueError:
        return "mlp"
    stack = next(name for name, m in model.named_modules() if m is blocks).rsplit(".", 1)[-1]
    children = [name for name, _ in blocks[-1].named_children()] or [""]
    child = next((c for c in children if "mlp" in c), children[-1])
    return f"{stack}.{len(blocks) - 1}.{child}".rstrip(".")


def check_frozen_modules(frozen_modules: Sequence[str] | None, **adapters: object) -> None:
    """Refuse a ``frozen_modules`` that is not a list of non-empty names, or one beside LoRA adapters
    (the ``adapters`` given by option name): LoRA chooses what trains itself."""
    if frozen_modules is None:
        return
    if isinstance(frozen_modules, str) or not all(isinstance(n, str) and n for n in frozen_modules):
        raise ValueError(f"frozen_modules must be null or a list of module names, got {frozen_modules!r}")
    for name, config in adapters.items():
        if config is not None and frozen_modules:
            raise ValueError(f"frozen_modules and {name} both choose what trains; set one of them")


def check_trainable_layers(trainable_layers: int | None, **adapters: object) -> None:
    """Refuse ``trainable_layers`` below 1, or beside LoRA adapters (the ``adapters`` given by option
    name, e.g. ``lora=...``): both choose what trains, so one of them must be left unset."""
    if trainable_layers is None:
        return
    if trainable_layers < 1:
        raise ValueError(f"trainable_layers must be >= 1 or null, got {trainable_layers}")
    for name, config in adapters.items():
        if config is not None:
            raise ValueError(f"trainable_layers and {name} both choose what trains; set one of them")

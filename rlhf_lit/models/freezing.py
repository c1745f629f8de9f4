"""Training only the top of a model: ``trainable_layers`` of the SFT, reward-model, DPO and PPO stages.

:func:`freeze_lower_layers` leaves the top N transformer blocks trainable, with everything that runs
after them (the final norm, a reward model's score head, a value head, an LM head of its own) and
freezes the rest: every embedding (token and position) and the blocks below. A frozen parameter has
``requires_grad`` False, so it receives no gradient and has no optimizer state, and since nothing
below the top blocks requires a gradient, autograd records nothing there: the backward pass stops at
the first trainable block (the time saved is the lower blocks' backward, about two thirds of their
cost, and their stored activations).

An LM head tied to the input embeddings (SmolLM2, GPT-2, Llama 3.2 1B) is the embedding matrix itself:
it stays frozen, for training it would send a gradient through every block down to the input
lookup and save nothing.
"""

from __future__ import annotations

from torch import nn


def transformer_blocks(model: nn.Module) -> nn.ModuleList:
    """The model's stack of transformer blocks: the ``nn.ModuleList`` holding the most parameters
    (``model.layers`` of Llama, ``transformer.h`` of GPT-2, ``gpt_neox.layers``, ...).

    Raises ``ValueError`` when the model has none (``trainable_layers`` needs blocks to count)."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    if not lists:
        raise ValueError(f"trainable_layers: {type(model).__name__} has no stack of transformer blocks to count")
    return max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))


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
    for block in blocks[: len(blocks) - trainable_layers]:
        block.requires_grad_(False)
    for module in model.modules():
        if isinstance(module, nn.Embedding):  # token and position embeddings (and a head tied to them)
            module.requires_grad_(False)
    return model


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

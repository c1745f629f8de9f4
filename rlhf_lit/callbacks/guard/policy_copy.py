"""A copy of the policy's weights on the CPU, and putting it back in place: what ``keep_best`` keeps.

The copy is of this process's own tensors (the whole model on one device or under ddp, where every
rank holds the same weights), so putting it back needs no collective. Sharded strategies are
refused by the guard for ``keep_best``.
"""

from __future__ import annotations

import torch


def copy_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor of ``model.state_dict()``, copied to the CPU (detached, not shared)."""
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in model.state_dict().items()}


@torch.no_grad()
def restore_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Copy ``weights`` (from :func:`copy_weights` of the same model) into ``model`` in place.

    In place: the optimizer and any wrapper keep pointing at the same parameters.
    """
    current = model.state_dict()  # detached views of the parameters and buffers
    missing = sorted(set(current) ^ set(weights))
    if missing:
        raise ValueError(f"the kept policy does not match the policy: {missing[:3]} differ")
    for name, tensor in current.items():
        tensor.copy_(weights[name])

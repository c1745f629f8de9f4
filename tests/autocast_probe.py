"""What precision each model forward of a run ran at (tests/cli/test_sampling_precision_cli.py and the demo's
labeller test): a global forward hook on every model, telling sampling from scoring by how it is called."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.nn.modules.module import register_module_forward_hook


def forward_kind(module: torch.nn.Module, kwargs: dict) -> str | None:
    """``sampling`` for a causal LM's forward inside ``generate`` (it passes its KV cache), ``scoring`` for a
    causal LM's teacher-forced pass (the KL's logprobs: no cache), ``reward model`` for a sequence classifier's;
    None for a module inside a model (its blocks, layers)."""
    name = type(module).__name__
    if name.endswith("ForCausalLM"):
        return "sampling" if kwargs.get("past_key_values") is not None else "scoring"
    if name.endswith("ForSequenceClassification"):
        return "reward model"
    return None


@contextmanager
def model_forwards() -> Iterator[list[tuple[str, torch.dtype | None]]]:
    """In the block, each model forward appends ``(kind, dtype)``: its :func:`forward_kind` and the CPU
    autocast dtype it ran under (None: no autocast)."""
    seen: list[tuple[str, torch.dtype | None]] = []

    def record(module, args, kwargs, output) -> None:
        kind = forward_kind(module, kwargs)
        if kind is not None:
            seen.append((kind, torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None))

    handle = register_module_forward_hook(record, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


def precisions(seen: list[tuple[str, torch.dtype | None]]) -> dict[str, set[torch.dtype | None]]:
    """The autocast dtypes each kind of forward ran under."""
    out: dict[str, set[torch.dtype | None]] = {}
    for kind, dtype in seen:
        out.setdefault(kind, set()).add(dtype)
    return out

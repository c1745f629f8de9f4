"""How long a sequence a model can read, checked before any step reads a longer one.

A model with a learned position table (GPT-2's ``n_positions``, OPT's ``max_position_embeddings``) has no
embedding for a position past it: a longer row ends inside the first forward pass with ``IndexError: index
out of range in self``, after the models loaded and the data was read. A rotary model (Llama, SmolLM2, GPT-J,
GPT-NeoX) reads any length, but past its ``max_position_embeddings`` it reads positions it was never trained
on: allowed (a user may extend the context on purpose), said once. A model with neither (ALiBi, relative
positions) is not checked.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PositionLimit:
    """``length`` positions of ``model`` (its path or hub name), from its config's ``key``; ``learned``:
    a table with no row past them (a hard limit), else rotary positions trained up to them."""

    model: str
    key: str
    length: int
    learned: bool


def position_limit(model: torch.nn.Module) -> PositionLimit | None:
    """The position limit of a Hugging Face model (a PEFT or other wrapper is looked through), or None when
    its config names none or its positions are neither learned nor rotary."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    key = next(
        (k for k in ("n_positions", "max_position_embeddings") if isinstance(getattr(config, k, None), int)), None
    )
    if key is None:
        return None
    length = getattr(config, key)
    modules = [type(m).__name__ for m in model.modules()]
    rotary = any("Rotary" in name for name in modules)
    # A learned table is an embedding with at least `length` rows (OPT keeps 2 more); the token embedding is
    # told apart by its size, the vocabulary's.
    vocab = getattr(config, "vocab_size", None)
    learned = not rotary and any(
        isinstance(m, torch.nn.Embedding) and m.num_embeddings != vocab and length <= m.num_embeddings <= length + 2
        for m in model.modules()
    )
    if not (rotary or learned):
        return None
    return PositionLimit(str(getattr(config, "_name_or_path", "") or type(model).__name__), key, length, learned)


def hf_models(modules: Iterable[torch.nn.Module | None]) -> list[torch.nn.Module]:
    """The Hugging Face models in ``modules`` and below them (None skipped: a stage, a critic, an ensemble are
    looked into), outermost first, each config once (a model and its inner model share one)."""
    seen: set[int] = set()
    out = []
    for module in (m for m in modules if m is not None):
        for model in module.modules():
            config = getattr(model, "config", None)
            if hasattr(config, "vocab_size") and id(config) not in seen:
                seen.add(id(config))
                out.append(model)
    return out


def check_sequence_length(models: Iterable[torch.nn.Module | None], length: int, where: str) -> None:
    """Refuse ``length`` tokens (the longest row a run will feed, ``where``: the options that set it) when a
    learned position table of a model in ``models`` (:func:`hf_models`) is shorter; say so once when a rotary
    model will read past its trained length.

    Raises:
        ValueError: one line naming the model, its config key and ``where``.
    """
    for model in hf_models(models):
        limit = position_limit(model)
        if limit is None or length <= limit.length:
            continue
        if limit.learned:
            raise ValueError(
                f"rows of up to {length} tokens ({where}) are longer than the position table of {limit.model} "
                f"({limit.key} {limit.length} in its config.json): a position past it has no embedding. "
                f"Keep them to {limit.length} tokens or fewer"
            )
        log.warning(
            "rows of up to %d tokens (%s) go past %s's %s %d: its rotary positions read them, but it was not "
            "trained on positions that far",
            length,
            where,
            limit.model,
            limit.key,
            limit.length,
        )

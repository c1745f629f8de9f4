"""The reward heads by name, and the one place the stage's settings choose one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from rlhf_lit.stages.reward_heads.ensemble_head import EnsembleConfig, EnsembleHead
from rlhf_lit.stages.reward_heads.head import RewardHead
from rlhf_lit.stages.reward_heads.odin_head import LengthDebiasConfig, OdinHead
from rlhf_lit.stages.reward_heads.plain_head import PlainHead

HeadKind = Literal["plain", "ensemble", "odin"]
"""``plain``: one reward model; ``ensemble``: M separate ones (``ensemble.members > 1``); ``odin``: one
with a length head beside it while training (``length_debias.method: odin``)."""

HEADS: dict[HeadKind, Callable[[EnsembleConfig, LengthDebiasConfig], RewardHead]] = {
    "plain": lambda ensemble, length_debias: PlainHead(),
    "ensemble": lambda ensemble, length_debias: EnsembleHead(ensemble),
    "odin": lambda ensemble, length_debias: OdinHead(length_debias),
}
"""Each head from the stage's ``ensemble`` and ``length_debias`` settings."""


def head_kind(ensemble: EnsembleConfig, length_debias: LengthDebiasConfig) -> HeadKind:
    """The head the settings ask for; two heads at once are refused in one line."""
    if length_debias.method == "odin":
        if ensemble.members > 1:
            raise ValueError(
                "length_debias.method odin is not supported with ensemble.members > 1; train one reward model"
            )
        return "odin"
    return "ensemble" if ensemble.members > 1 else "plain"


def build_head(ensemble: EnsembleConfig, length_debias: LengthDebiasConfig, lora: bool) -> RewardHead:
    """The reward head of the stage's settings (:func:`head_kind`); one it cannot train with LoRA is refused."""
    head = HEADS[head_kind(ensemble, length_debias)](ensemble, length_debias)
    if lora and head.lora_refusal:
        raise ValueError(head.lora_refusal)
    return head

"""The plain reward head: one reward model, one score per sequence, the Bradley-Terry loss on pairs
and InstructGPT's ranking loss on rankings (:func:`~rlhf_lit.stages.reward_heads.head.preference_loss`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from rlhf_lit.models import sequence_scores
from rlhf_lit.stages.reward_heads.head import Batch, Log, LossAndStatistics, Sequences, TrainingStep, preference_loss
from rlhf_lit.stages.reward_heads.validation import ScoreValidation


class PlainHead(nn.Module):
    """One reward model (:class:`~rlhf_lit.stages.reward_heads.head.RewardHead`): scores ``(N,)``,
    validated by :class:`~rlhf_lit.stages.reward_heads.validation.ScoreValidation`, clipped and
    exported as a whole."""

    normalization_shape: tuple[int, ...] = ()
    lora_refusal: str | None = None
    fsdp_refusal: str | None = None

    def __init__(self) -> None:
        super().__init__()
        self.validation = ScoreValidation()

    def build(self, model: nn.Module, new_head: bool, adapt: Callable[[nn.Module], nn.Module]) -> nn.Module:
        """``model`` adapted (after the head init: the head trains in full)."""
        return adapt(model)

    def scores(self, model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The score head at the last real token, ``(N,)``."""
        return sequence_scores(model, input_ids, attention_mask)  # (N,)

    def loss(self, model: nn.Module, sequences: Sequences, batch: Batch, step: TrainingStep) -> LossAndStatistics:
        """The preference loss of the raw scores (the bias cancels; the gain is 1 while training)."""
        loss, accuracy = preference_loss(self.scores(model, *sequences), batch)  # (), ()
        return loss, {"loss": loss.detach(), "accuracy": accuracy}

    def validate(self, scores: torch.Tensor, batch: Batch, log: Log) -> None:
        """:class:`~rlhf_lit.stages.reward_heads.validation.ScoreValidation` of the normalised ``scores`` ``(N,)``."""
        self.validation.update(scores, batch, log)

    def clip_gradients(
        self, model: nn.Module, clip_val: float | None, algorithm: str | None, clip_whole: Callable[[], None]
    ) -> None:
        """Lightning's clipping of the whole model."""
        clip_whole()

    def ready_for_export(self, model: nn.Module) -> list[nn.Module]:
        """The model as it is: it takes the normalisation and is exported."""
        return [model]

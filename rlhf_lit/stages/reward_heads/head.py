"""What the reward-model stage asks of a reward head, and the batch readings every head shares.

A reward head is what makes one reward model differ from another in training: what the scores are
(one per sequence, or one per member), how they are trained, validated, clipped and exported. The
stage (:class:`~rlhf_lit.stages.RewardModelModule`) loads the model, keeps the normalisation (the
``reward_gain`` / ``reward_bias`` buffers, of the head's :attr:`RewardHead.normalization_shape`) and
calls the head; it never asks which head it holds. A head gets what it needs passed in: the model,
the batch, the batch's sequences, a :class:`TrainingStep`, the stage's ``log``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

import torch
from torch import nn

from rlhf_lit.functional import is_ranking_batch, pairwise_reward_loss, ranking_loss

Batch = dict[str, torch.Tensor]
Sequences = tuple[torch.Tensor, torch.Tensor]
"""``(input_ids, attention_mask)``, each ``(N, T)``: a batch's sequences (:func:`~rlhf_lit.functional.batch_sequences`)."""
LossAndStatistics = tuple[torch.Tensor, dict[str, torch.Tensor]]
"""A training batch's loss to differentiate and its statistics (detached; logged as ``train/<name>``)."""
Log = Callable[..., None]
"""The stage's ``self.log``: ``log(name, value_or_metric, prog_bar=False, batch_size=B)``."""


class TrainingStep(NamedTuple):
    """Where a training batch sits in the run (an ensemble's bootstrap draws are a function of it)."""

    epoch: int
    batch_idx: int
    rank: int


class RewardHead(Protocol):
    """One variant of the reward model, chosen once by :func:`~rlhf_lit.stages.reward_heads.registry.build_head`.

    Scores ``(N,)`` are one per sequence, ``(N, M)`` one per member of an ensemble (a column each);
    ``N`` rows in :func:`batch_sequences` order. A head is an ``nn.Module`` holding its validation
    metrics (never the model: the stage holds that, so checkpoint keys stay ``model.*``).
    """

    normalization_shape: tuple[int, ...]
    """The shape of one sequence's score, hence of the normalisation buffers: ``()`` or ``(M,)``."""
    lora_refusal: str | None
    """Why the head cannot train with LoRA (the error message), or None."""
    fsdp_refusal: str | None
    """Why the head cannot train under fsdp / fsdp2 (the error message, given before any step), or None."""

    def build(self, model: nn.Module, new_head: bool, adapt: Callable[[nn.Module], nn.Module]) -> nn.Module:
        """The model the stage trains, from the loaded start ``model`` (its score head already
        initialised when ``new_head``); ``adapt`` adds LoRA and gradient checkpointing to one model."""

    def scores(self, model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The raw scores (before normalisation) of ``(N, T)`` sequences: ``(N,)`` or ``(N, M)``."""

    def loss(self, model: nn.Module, sequences: Sequences, batch: Batch, step: TrainingStep) -> LossAndStatistics:
        """The loss and statistics of one training batch (``sequences``: its :func:`batch_sequences`)."""

    def validate(self, scores: torch.Tensor, batch: Batch, log: Log) -> None:
        """Update and log the validation metrics from the batch's normalised ``scores``."""

    def clip_gradients(
        self, model: nn.Module, clip_val: float | None, algorithm: str | None, clip_whole: Callable[[], None]
    ) -> None:
        """Clip the gradients (``trainer.gradient_clip_val``); ``clip_whole`` is Lightning's clipping
        of the whole model (precision and strategy aware)."""

    def ready_for_export(self, model: nn.Module) -> list[nn.Module]:
        """Make ``model`` what the export holds and return the one-label reward models that take the
        normalisation, one per score column."""


def preference_loss(
    scores: torch.Tensor, batch: Batch, weight: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, pair accuracy)`` of the scores ``(N,)`` of :func:`batch_sequences`' rows: the
    Bradley-Terry loss of a pair batch, InstructGPT's ranking loss of a ranking batch.

    ``weight`` weighs the batch's examples (an ensemble member's bootstrap counts): ``(B,)`` one per
    prompt of a ranking batch, one per pair of a pair batch; None is the plain mean.
    """
    if is_ranking_batch(batch):
        return ranking_loss(scores, batch["group"], batch["rank"], batch["responses_per_prompt"], weight)
    B = batch["chosen_input_ids"].shape[0]
    return pairwise_reward_loss(scores[:B], scores[B:], batch.get("margin"), weight)  # (), ()


def response_lengths(batch: Batch) -> torch.Tensor:
    """``(N,)`` each response's length in tokens (real tokens after its prompt), in
    :func:`batch_sequences` row order."""
    if "prompt_length" not in batch:
        raise ValueError(
            "length_debias.method odin needs each batch's prompt_length (the prompt tokens of every row) to "
            "measure response lengths; rlhf_lit.data.PreferenceDataModule provides it (docs/CONTRACTS.md)"
        )
    if is_ranking_batch(batch):  # one prompt_length per row
        return batch["attention_mask"].sum(dim=1) - batch["prompt_length"]  # (N,)
    prompt = batch["prompt_length"]  # (B,)
    chosen = batch["chosen_attention_mask"].sum(dim=1) - prompt  # (B,)
    rejected = batch["rejected_attention_mask"].sum(dim=1) - prompt  # (B,)
    return torch.cat([chosen, rejected])  # (2B,)

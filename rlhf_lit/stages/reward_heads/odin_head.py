"""A reward model that does not pay for length: the ``length_debias`` setting of the reward-model stage.

With ``length_debias.method: odin`` (Chen et al., "ODIN: Disentangled Reward Mitigates Hacking in
RLHF", ICML 2024) the reward model gets a second linear head on its trunk while it trains:

- the score head becomes two rows, row 0 the quality head (the one that is exported and used
  downstream; a head the start model already had stays there), row 1 a length head, initialised
  like a fresh reward head;
- the preference loss (pairs or rankings) is taken on the sum of the two heads' scores, so the
  length head can explain the part of the labels that length explains;
- plus ``correlation_weight * (|rho(quality, L)| - rho(length, L))`` with ``rho`` Pearson's
  correlation over the batch's responses and ``L`` each response's length in tokens (its real
  tokens after ``prompt_length``), and ``orthogonality_weight * |cos(w_quality, w_length)|``
  (:mod:`rlhf_lit.functional.length_correlation`). The paper's weights are 1 and 1.

Validation and the reward normalisation read the quality head alone (what the export gives). At the
end of fit the length head is dropped: the export is an ordinary one-label reward model carrying the
quality head, so PPO, ``evaluate`` and ``best-of-n`` read it unchanged.

Not supported (refused in one line before any step): ensembles, LoRA and FSDP (the head would have
to be cut out of an adapter or out of shards at export).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import nn

from rlhf_lit.functional.length_correlation import head_orthogonality, length_correlation_loss
from rlhf_lit.models import init_reward_head, score_head, sequence_scores
from rlhf_lit.option_values import check_choice
from rlhf_lit.stages.reward_heads.head import (
    Batch,
    LossAndStatistics,
    Sequences,
    TrainingStep,
    preference_loss,
    response_lengths,
)
from rlhf_lit.stages.reward_heads.plain_head import PlainHead

LengthDebiasMethod = Literal["none", "odin"]
"""``none``: one head, the plain Bradley-Terry reward model; ``odin``: quality and length heads (module docstring)."""

QUALITY, LENGTH = 0, 1
"""The rows of the two-head score head: the quality head (exported) and the length head (dropped)."""


@dataclass(frozen=True)
class LengthDebiasConfig:
    """How the reward model is kept from paying for length (``model.init_args.length_debias``).

    Args:
        method: see :data:`LengthDebiasMethod`.
        correlation_weight: the weight of ODIN's correlation term (``lambda_L`` in the paper).
        orthogonality_weight: the weight of ODIN's orthogonality term (``lambda_O`` in the paper).
    """

    method: LengthDebiasMethod = "none"
    correlation_weight: float = 1.0
    orthogonality_weight: float = 1.0

    def __post_init__(self) -> None:
        check_choice("length_debias.method", self.method, get_args(LengthDebiasMethod))
        for name in ("correlation_weight", "orthogonality_weight"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
                raise ValueError(f"length_debias.{name} must be a number >= 0, got {value!r}")


def _linear_like(head: nn.Linear, rows: int) -> nn.Linear:
    """A fresh ``rows``-output linear layer of ``head``'s width, bias, dtype and device."""
    return nn.Linear(
        head.in_features, rows, bias=head.bias is not None, dtype=head.weight.dtype, device=head.weight.device
    )


def _set_head(model: nn.Module, head: nn.Linear, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Make ``head`` (filled with ``weight`` and ``bias``) ``model``'s score head, and the config's
    label count (and so its default label names: transformers' ``num_labels`` setter) match its rows."""
    with torch.no_grad():
        head.weight.copy_(weight)
        if bias is not None:
            head.bias.copy_(bias)
    model.score = head
    model.config.num_labels = head.out_features
    model.num_labels = head.out_features


def add_length_head(model: nn.Module) -> None:
    """Give ``model`` a two-row score head: its own head as row :data:`QUALITY`, a freshly initialised
    length head as row :data:`LENGTH` (drawn from the global RNG, so the run's seed fixes it)."""
    head = score_head(model)
    fresh = _linear_like(head, 1)
    init_reward_head(fresh)
    both = _linear_like(head, 2)
    bias = None if head.bias is None else torch.cat([head.bias, fresh.bias])
    _set_head(model, both, torch.cat([head.weight, fresh.weight]), bias)


def drop_length_head(model: nn.Module) -> None:
    """Keep the quality head alone: ``model`` becomes an ordinary one-label reward model."""
    head = score_head(model)
    if head.out_features != 2:
        return
    rows = slice(QUALITY, QUALITY + 1)
    _set_head(model, _linear_like(head, 1), head.weight[rows], None if head.bias is None else head.bias[rows])


def odin_loss(
    config: LengthDebiasConfig, heads: torch.Tensor, head_weight: torch.Tensor, batch: Batch
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """ODIN's loss from both heads' scores ``(N, 2)`` and the score head's weight ``(2, D)``: the
    preference loss of their sum plus the weighted correlation and orthogonality terms. Returns
    ``(loss, statistics)``, the statistics detached: the preference loss and accuracy (of the sum),
    both correlations and the heads' ``|cos|``."""
    preference, accuracy = preference_loss(heads.sum(dim=1), batch)  # (), ()
    lengths = response_lengths(batch).to(heads.device)  # (N,)
    correlation, rho_quality, rho_length = length_correlation_loss(heads[:, QUALITY], heads[:, LENGTH], lengths)
    orthogonality = head_orthogonality(head_weight[QUALITY], head_weight[LENGTH])  # ()
    loss = preference + config.correlation_weight * correlation + config.orthogonality_weight * orthogonality
    stats = {
        "preference_loss": preference,
        "accuracy": accuracy,
        "quality_length_correlation": rho_quality,
        "length_head_correlation": rho_length,
        "head_orthogonality": orthogonality,
    }
    return loss, {k: v.detach() for k, v in stats.items()}


class OdinHead(PlainHead):
    """The plain head with a length head beside it while training (module docstring); validated,
    clipped and normalised on the quality row, exported without the length row."""

    lora_refusal = (
        "length_debias.method odin is not supported with lora (the length head is cut out of the full "
        "model at export); train the full model or set length_debias.method none"
    )
    fsdp_refusal = (  # the length head is cut out of the whole head at export, not out of shards
        "length_debias.method odin is not supported under fsdp / fsdp2; use one device or --trainer.strategy ddp"
    )

    def __init__(self, config: LengthDebiasConfig) -> None:
        super().__init__()
        self.config = config

    def build(self, model: nn.Module, new_head: bool, adapt: Callable[[nn.Module], nn.Module]) -> nn.Module:
        """``model`` with a length head beside its score head, then adapted (gradient checkpointing)."""
        add_length_head(model)
        return adapt(model)

    def scores(self, model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The quality row ``(N,)`` (after the export, the one row left)."""
        scores = sequence_scores(model, input_ids, attention_mask)  # (N, 2), or (N,) once the length head is dropped
        return scores[:, QUALITY] if scores.dim() == 2 else scores  # (N,)

    def loss(self, model: nn.Module, sequences: Sequences, batch: Batch, step: TrainingStep) -> LossAndStatistics:
        """:func:`odin_loss` of both heads' scores, logged with its parts."""
        loss, stats = odin_loss(self.config, sequence_scores(model, *sequences), score_head(model).weight, batch)
        return loss, {"loss": loss.detach(), **stats}

    def ready_for_export(self, model: nn.Module) -> list[nn.Module]:
        """The model without its length head: an ordinary one-label reward model."""
        drop_length_head(model)
        return [model]

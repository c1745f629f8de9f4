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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

import torch
from torch import nn

from rlhf_lit.functional import is_ranking_batch
from rlhf_lit.functional.length_correlation import head_orthogonality, length_correlation_loss
from rlhf_lit.models import init_reward_head, score_head

if TYPE_CHECKING:
    from rlhf_lit.stages.reward_model import RewardModelModule

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
        if self.method not in get_args(LengthDebiasMethod):
            raise ValueError(
                f"length_debias.method must be one of {', '.join(get_args(LengthDebiasMethod))}; got {self.method!r}"
            )
        for name in ("correlation_weight", "orthogonality_weight"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
                raise ValueError(f"length_debias.{name} must be a number >= 0, got {value!r}")

    @property
    def enabled(self) -> bool:
        """Whether the reward model trains a length head."""
        return self.method == "odin"


def refuse_unsupported(config: LengthDebiasConfig, members: int, lora: bool) -> None:
    """One line, before any work, for a combination the two-head model does not support."""
    if not config.enabled:
        return
    if members > 1:
        raise ValueError("length_debias.method odin is not supported with ensemble.members > 1; train one reward model")
    if lora:
        raise ValueError(
            "length_debias.method odin is not supported with lora (the length head is cut out of the full "
            "model at export); train the full model or set length_debias.method none"
        )


def refuse_sharding(module: RewardModelModule) -> None:
    """The length head is cut out of the whole head at export, not out of shards: fsdp is refused."""
    if module.length_debias.enabled and getattr(module, "_device_mesh", None) is not None:
        raise ValueError(
            "length_debias.method odin is not supported under fsdp / fsdp2; use one device or --trainer.strategy ddp"
        )


def add_length_head(model: nn.Module) -> None:
    """Give ``model`` a two-row score head: its own head as row :data:`QUALITY`, a freshly initialised
    length head as row :data:`LENGTH` (drawn from the global RNG, so the run's seed fixes it)."""
    head = score_head(model)
    fresh = nn.Linear(
        head.in_features, 1, bias=head.bias is not None, dtype=head.weight.dtype, device=head.weight.device
    )
    init_reward_head(fresh)
    both = nn.Linear(
        head.in_features, 2, bias=head.bias is not None, dtype=head.weight.dtype, device=head.weight.device
    )
    with torch.no_grad():
        both.weight.copy_(torch.cat([head.weight, fresh.weight]))
        if head.bias is not None:
            both.bias.copy_(torch.cat([head.bias, fresh.bias]))
    model.score = both
    _set_labels(model, 2)


def drop_length_head(model: nn.Module) -> None:
    """Keep the quality head alone: ``model`` becomes an ordinary one-label reward model."""
    head = score_head(model)
    if head.out_features != 2:
        return
    quality = nn.Linear(
        head.in_features, 1, bias=head.bias is not None, dtype=head.weight.dtype, device=head.weight.device
    )
    with torch.no_grad():
        quality.weight.copy_(head.weight[QUALITY : QUALITY + 1])
        if head.bias is not None:
            quality.bias.copy_(head.bias[QUALITY : QUALITY + 1])
    model.score = quality
    _set_labels(model, 1)


def _set_labels(model: nn.Module, n: int) -> None:
    """The config's label count (and its default label names) for an ``n``-row head."""
    model.config.num_labels = n
    model.config.id2label = {i: f"LABEL_{i}" for i in range(n)}
    model.config.label2id = {v: k for k, v in model.config.id2label.items()}
    model.num_labels = n


def response_lengths(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``(N,)`` each response's length in tokens (real tokens after its prompt), in the row order of
    ``RewardModelModule.batch_sequences``: a pair batch's chosen rows then its rejected rows, a
    ranking batch's rows as they are."""
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


def odin_loss(
    module: RewardModelModule, heads: torch.Tensor, batch: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The reward model's training loss from both heads' scores ``(N, 2)``: the preference loss of
    their sum plus the weighted correlation and orthogonality terms. Returns ``(loss, statistics)``,
    the statistics detached: the preference loss and accuracy (of the sum), both correlations and the
    heads' ``|cos|``."""
    config = module.length_debias
    preference, accuracy = module.preference_loss(heads.sum(dim=1), batch)  # (), ()
    lengths = response_lengths(batch).to(heads.device)  # (N,)
    correlation, rho_quality, rho_length = length_correlation_loss(heads[:, QUALITY], heads[:, LENGTH], lengths)
    weight = score_head(module.model).weight  # (2, D)
    orthogonality = head_orthogonality(weight[QUALITY], weight[LENGTH])  # ()
    loss = preference + config.correlation_weight * correlation + config.orthogonality_weight * orthogonality
    stats = {
        "preference_loss": preference,
        "accuracy": accuracy,
        "quality_length_correlation": rho_quality,
        "length_head_correlation": rho_length,
        "head_orthogonality": orthogonality,
    }
    return loss, {k: v.detach() for k, v in stats.items()}

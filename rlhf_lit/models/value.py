"""The critic: one value per token, from a separate value model or from a head on the policy's trunk.

Both kinds share one call, ``critic(input_ids, attention_mask, policy_hidden) -> (B, T)``, where
``policy_hidden`` is the last hidden state of the policy's forward pass on the same tokens (only
the shared-trunk head reads it; ``needs_policy_hidden`` tells the caller to ask for it).
The kind is chosen in one place, :func:`build_critic`.
"""

from __future__ import annotations

import logging
from typing import Literal

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rlhf_lit.models.loading import ModelLoading, has_score_head, load_reward_model
from rlhf_lit.models.lora import LoRAConfig, with_lora
from rlhf_lit.models.reward_norm import reward_offset
from rlhf_lit.models.scoring import score_head, token_scores

log = logging.getLogger(__name__)

CriticKind = Literal["separate", "shared_trunk"]
"""``separate``: a value model of its own (``AutoModelForSequenceClassification`` whose score head is
applied at every token), initialised from the reward model by default (N+ detail 16).
``shared_trunk``: a zero-initialised linear head on the policy's last hidden state; the value loss
then also trains the policy's trunk (cheaper: one model fewer, one forward pass fewer)."""


def zeroed(head: nn.Linear) -> nn.Linear:
    """``head`` with its weight and bias set to 0: a new value head starts predicting 0 (N details #4)."""
    nn.init.zeros_(head.weight)
    if head.bias is not None:
        nn.init.zeros_(head.bias)
    return head


class SeparateCritic(nn.Module):
    """A value model of its own: the score head of a sequence-classification model at every token.

    A reward model exported with a normalisation bias it could not fold into its weights (Llama:
    ``config.reward_bias``) scores ``logit + bias``; the critic adds the same constant at every
    token, so a critic initialised from that RM starts with its value at the last token equal to
    the reward PPO uses. Without it every value would be off by the bias and GAE would put a
    systematic advantage on the last token.

    Args:
        model: an ``AutoModelForSequenceClassification`` with one label.
    """

    needs_policy_hidden = False

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.model = model
        self.offset = reward_offset(model.config)  # 0.0 for a folded or plain model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, policy_hidden: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Values ``(B, T)``; the value model reads query + response (N detail 1)."""
        return token_scores(self.model, input_ids, attention_mask) + self.offset  # (B, T)


class ValueHead(nn.Module):
    """A linear value head on the policy's last hidden state, zero-initialised (N detail 4).

    Args:
        hidden_size: width of the policy's hidden state.
    """

    needs_policy_hidden = True

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.head = zeroed(nn.Linear(hidden_size, 1))

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, policy_hidden: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Values ``(B, T)`` from ``policy_hidden (B, T, D)``."""
        if policy_hidden is None:
            raise ValueError("the shared-trunk value head needs the policy's last hidden state")
        return self.head(policy_hidden.to(self.head.weight.dtype)).squeeze(-1)  # (B, T)


def load_value_model(
    name_or_path: str,
    tokenizer: PreTrainedTokenizerBase | None = None,
    loading: ModelLoading = ModelLoading(),
    lora: LoRAConfig | None = None,
) -> SeparateCritic:
    """A separate critic from a reward model (its head kept) or from a causal LM (a new, zeroed head),
    loaded as ``loading`` says, with LoRA adapters on its trunk when ``lora`` is given (the head then
    still trains in full)."""
    new_head = not has_score_head(name_or_path, "value model", loading)
    model = load_reward_model(name_or_path, tokenizer, loading, new_head=new_head)
    if new_head:
        # A brand-new value head starts at 0 so early value errors equal the returns (N detail 4).
        log.info("value model %s has no score head: the new head is zero-initialised", name_or_path)
        zeroed(score_head(model))
    return SeparateCritic(with_lora(model, lora, "reward"))


def build_critic(
    kind: CriticKind,
    policy: PreTrainedModel,
    value_model: str,
    tokenizer: PreTrainedTokenizerBase | None = None,
    loading: ModelLoading = ModelLoading(),
    lora: LoRAConfig | None = None,
) -> SeparateCritic | ValueHead:
    """The one place the critic kind is chosen.

    Args:
        kind: see :data:`CriticKind`.
        policy: the policy (its hidden size sizes a shared-trunk head).
        value_model: path or hub name of the separate value model (unused for ``shared_trunk``).
        tokenizer: the run's tokenizer (embeddings resized to it).
        loading: how a separate value model is loaded (:class:`~rlhf_lit.models.loading.ModelLoading`).
        lora: LoRA adapters on a separate value model (refused for ``shared_trunk``).
    """
    if kind == "separate":
        return load_value_model(value_model, tokenizer, loading, lora)
    if lora is not None:
        raise ValueError("critic_lora applies to a separate critic; with critic='shared_trunk' leave it null")
    if kind == "shared_trunk":
        return ValueHead(policy.config.hidden_size)
    raise ValueError(f"critic must be 'separate' or 'shared_trunk', got {kind!r}")

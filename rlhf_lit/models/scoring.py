"""Reading a scalar from a sequence model: a score at the last real token, or a response's logprob."""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel

from rlhf_lit.functional import last_true_index, sequence_logprobs


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that count only real tokens: ``cumsum(mask) - 1`` clamped at 0.

    Under left padding this gives a row the same positions it has unpadded, so logprobs of a
    padded batch match those of each row alone (N implementation details #2).
    """
    position_ids = attention_mask.long().cumsum(-1) - 1  # (B, T)
    return position_ids.clamp(min=0)


def score_head(model: PreTrainedModel) -> nn.Linear:
    """The linear head of a Hugging Face sequence-classification model (``score`` in causal-LM families)."""
    head = getattr(model, "score", None)
    if not isinstance(head, nn.Linear):
        raise TypeError(f"{type(model).__name__} has no linear `score` head; use a causal-LM family model")
    return head


def backbone(model: PreTrainedModel) -> nn.Module:
    """The transformer trunk of a Hugging Face task model (``model.model``, ``model.transformer``, ...)."""
    return getattr(model, model.base_model_prefix)


def token_scores(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The score head applied at every position, ``(B, T)``; used for values (one per token).

    Read from the model's own forward pass (a hook on the head, which Hugging Face's
    causal-LM-family classifiers apply at every position before pooling the last one), not by
    calling the trunk and the head apart: under FSDP a model's weights are gathered by its own
    forward pass (:mod:`rlhf_lit.models.sharding`).
    """
    head = score_head(model)
    captured: list[torch.Tensor] = []
    handle = head.register_forward_hook(lambda module, args, output: captured.append(output))
    try:
        model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
            use_cache=False,
        )
    finally:
        handle.remove()
    if len(captured) != 1 or captured[0].shape[:2] != input_ids.shape:
        raise ValueError(
            f"{type(model).__name__} does not apply its score head once at every position; rlhf-lit reads "
            "per-token scores (use a causal-LM family model)"
        )
    return captured[0].squeeze(-1)  # (B, T)


def sequence_scores(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The reward: the score head read at the last real token of each row, ``(B,)``.

    Never relies on pad ids (the pad may equal EOS), only on the attention mask.
    """
    scores = token_scores(model, input_ids, attention_mask)  # (B, T)
    # -1 for a row with no real token: gather then fails loudly instead of reading position 0.
    last = last_true_index(attention_mask.bool())  # (B,)
    return scores.gather(1, last.unsqueeze(1)).squeeze(1)  # (B,)


def response_sequence_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_mask: torch.Tensor,
    average: bool = False,
) -> torch.Tensor:
    """``(B,)`` log-probability of each row's response tokens under the causal LM ``model``.

    One forward pass with positions counting real tokens only (left or right padding give the
    same numbers), then :func:`rlhf_lit.functional.sequence_logprobs`: the sum over the tokens
    where ``response_mask`` is True, or their mean with ``average``. Gradients flow when the
    caller allows them (the trained policy); the reference calls it under ``torch.no_grad()``.

    Args:
        model: a causal LM returning ``.logits (B, T, V)``.
        input_ids: ``(B, T)``.
        attention_mask: ``(B, T)``, 1 on real tokens.
        response_mask: bool ``(B, T)``, True on the response tokens.
        average: token mean instead of sum.
    """
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    ).logits  # (B, T, V)
    return sequence_logprobs(logits, input_ids, response_mask, average)  # (B,)

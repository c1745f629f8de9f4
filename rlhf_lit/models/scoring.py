"""Reading a scalar from a sequence model at the last real token."""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel

from rlhf_lit.functional import last_true_index


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that count only real tokens: ``cumsum(mask) - 1`` clamped at 0.

    Under left padding this gives a row the same positions it has unpadded, so logprobs of a
    padded batch match those of each row alone (N implementation details #2).
    """
    position_ids = attention_mask.long().cumsum(-1) - 1  # (B, T)
    return position_ids.clamp(min=0)


def _runs_in_16bit(model: nn.Module) -> bool:
    """Whether ``model`` computes in bf16 / fp16 here: under CUDA autocast, or with 16-bit weights."""
    if torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") in (torch.bfloat16, torch.float16):
        return True
    param = next(model.parameters(), None)
    return param is not None and param.dtype in (torch.bfloat16, torch.float16)


def self_attending_causal_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A ``(B, 1, T, T)`` additive causal padding mask in which a pad position attends to itself.

    0 where query ``i`` may attend key ``j`` (``j <= i`` and ``j`` a real token, or ``j == i``), the
    dtype's minimum elsewhere. A real token's row is the usual causal padding mask, so no real
    position's output changes; only a pad row, which the usual mask leaves with no key at all, gets one.
    """
    real = attention_mask.bool()  # (B, T)
    length = real.shape[1]
    ones = torch.ones(length, length, dtype=torch.bool, device=real.device)  # (T, T)
    allowed = (ones.tril()[None] & real[:, None, :]) | ones.diag().diag()[None]  # (B, T, T): query i, key j
    mask = torch.zeros(allowed.shape, dtype=dtype, device=real.device).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[:, None]  # (B, 1, T, T)


def model_attention_mask(model: nn.Module, attention_mask: torch.Tensor) -> torch.Tensor:
    """The attention mask to give ``model`` for a teacher-forced pass over left-padded rows.

    The 2-D padding mask, except in 16-bit on CUDA: there a query row with no key to attend to (a
    left-pad position under a causal mask) makes SDPA's attention kernels return NaN gradients for
    the whole batch. Measured with GPT-2 (124M) under ``bf16-mixed`` on an H100 (torch 2.11, 15 of
    16 rows left-padded): every policy gradient was NaN while the loss was finite; fp32, and eager
    attention in bf16, were finite. There the mask is :func:`self_attending_causal_mask` (a pad
    attends to itself; pads never reach a loss and real tokens never attend to pads).
    """
    if attention_mask.device.type != "cuda" or attention_mask.dim() != 2 or not _runs_in_16bit(model):
        return attention_mask
    dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else next(model.parameters()).dtype
    return self_attending_causal_mask(attention_mask, dtype)


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
            attention_mask=model_attention_mask(model, attention_mask),
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

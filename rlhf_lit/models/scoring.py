"""Reading a scalar from a sequence model: a score at the last real token, or a response's logprob."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn
from transformers import PreTrainedModel

from rlhf_lit.functional import append_eos_to_unfinished, last_true_index, sequence_logprobs
from rlhf_lit.models.packing import pack_rows, packing_applies

if TYPE_CHECKING:
    from rlhf_lit.models.generation import Generated

UnfinishedScoring = Literal["as_sampled", "with_eos"]
"""How a reward model reads a response that reached ``max_new_tokens`` without EOS: ``as_sampled``
scores the tokens as they are, its last token a word in mid-story; ``with_eos`` appends EOS for the
reward model's pass only (the policy's tokens, logprobs and KL are unchanged), the way rlhf-lit's
reward-model stage trained it: its preference data end every response, cut ones included, with
EOS. A reward model never trained on a sequence without a final EOS can score one anywhere; the
demo's scored its cut SFT samples 0.45 std lower as sampled than with EOS, so PPO was paid for
ending a story rather than for what it said (docs/DEMO.md, "PPO that climbs its own objective")."""


def reward_model_rows(
    generated: Generated, unfinished: UnfinishedScoring, eos_token_id: int, pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows a reward model reads for the prompt + response rows ``(B, T)`` of ``generated``: as they
    are, or with EOS after every response that did not end (``(B, T + 1)``; see :data:`UnfinishedScoring`)."""
    ids, mask = generated.query_responses, generated.attention_mask  # (B, T) x2
    if unfinished == "as_sampled":
        return ids, mask
    if unfinished == "with_eos":
        return append_eos_to_unfinished(ids, mask, generated.ended, eos_token_id, pad_token_id)
    raise ValueError(f"unfinished must be as_sampled or with_eos, got {unfinished!r}")


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
    """The score head applied at every position, ``(B, T)`` (a head of K > 1 rows: ``(B, T, K)``);
    used for values (one per token).

    Read from the model's own forward pass (a hook on the head, which Hugging Face's
    causal-LM-family classifiers apply at every position before pooling the last one), not by
    calling the trunk and the head apart: under FSDP a model's weights are gathered by its own
    forward pass (:mod:`rlhf_lit.models.sharding`).
    """
    head = score_head(model)
    rows = pack_rows(input_ids, attention_mask) if packing_applies(model, attention_mask) else None
    if rows is not None:  # padding-free (rlhf_lit.models.packing): the real tokens as one sequence
        inputs = dict(input_ids=rows.input_ids, position_ids=rows.position_ids, use_cache=False)
    else:
        inputs = dict(
            input_ids=input_ids,
            attention_mask=model_attention_mask(model, attention_mask),
            position_ids=position_ids_from_mask(attention_mask),
            use_cache=False,
        )
    if torch.compiler.is_compiling():
        # A hook cannot be registered inside a compiled graph; compiled passes are refused under
        # FSDP (the reason for the hook), so the trunk and the head are called apart.
        return head(backbone(model)(**inputs).last_hidden_state).squeeze(-1)  # (B, T, D) -> (B, T)
    captured: list[torch.Tensor] = []
    handle = head.register_forward_hook(lambda module, args, output: captured.append(output))
    try:
        model(**inputs)
    finally:
        handle.remove()
    if len(captured) != 1 or captured[0].shape[:2] != inputs["input_ids"].shape:
        raise ValueError(
            f"{type(model).__name__} does not apply its score head once at every position; rlhf-lit reads "
            "per-token scores (use a causal-LM family model)"
        )
    scores = captured[0].squeeze(-1)  # (B, T), or (1, N) packed
    return scores if rows is None else rows.unpack(scores)  # (B, T), zeros on padding when packed


def sequence_scores(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The reward: the score head read at the last real token of each row, ``(B,)``; a head of K > 1
    rows (a reward model training a length head, :mod:`rlhf_lit.stages.reward_heads.odin_head`) gives ``(B, K)``.

    Never relies on pad ids (the pad may equal EOS), only on the attention mask.
    """
    scores = token_scores(model, input_ids, attention_mask)  # (B, T) or (B, T, K)
    # -1 for a row with no real token: gather then fails loudly instead of reading position 0.
    last = last_true_index(attention_mask.bool())  # (B,)
    if scores.dim() == 3:
        index = last[:, None, None].expand(-1, 1, scores.shape[2])  # (B, 1, K)
        return scores.gather(1, index).squeeze(1)  # (B, K)
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
    where ``response_mask`` is True, or their mean with ``average``. The LM head runs only from the
    position predicting the batch's first response token on (``logits_to_keep``): the prompt
    positions' logits are never read, and at a large vocabulary the head and its log-softmax cost as
    much as several blocks. Gradients flow when the caller allows them (the trained policy); the
    reference calls it under ``torch.no_grad()``.

    Args:
        model: a causal LM returning ``.logits (B, T, V)``.
        input_ids: ``(B, T)``.
        attention_mask: ``(B, T)``, 1 on real tokens.
        response_mask: bool ``(B, T)``, True on the response tokens.
        average: token mean instead of sum.
    """
    start = 1  # token 0 is never predicted; on the meta device (a released model) nothing to read
    if response_mask.device.type != "meta":
        columns = response_mask.bool().any(dim=0).nonzero()  # (C, 1) columns holding a response token
        start = max(int(columns[0, 0]), 1) if columns.numel() else 1
    keep = input_ids.shape[1] - (start - 1)  # positions start - 1 .. T - 1
    logits = causal_lm_logits(model, input_ids, attention_mask, logits_to_keep=keep)  # (B, keep, V)
    return sequence_logprobs(logits, input_ids[:, start - 1 :], response_mask[:, start - 1 :], average)  # (B,)


def accepts_logits_to_keep(model: nn.Module) -> bool:
    """Whether ``model``'s forward takes ``logits_to_keep`` (transformers' causal LMs; a peft or
    FSDP wrapper passes it through its ``**kwargs``)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    return "logits_to_keep" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def causal_lm_logits(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int | None = None
) -> torch.Tensor:
    """``(B, T, V)`` logits of one causal-LM forward pass whose positions count real tokens only
    (:func:`position_ids_from_mask`: left or right padding give the same numbers); with
    ``logits_to_keep`` the last that many positions only, ``(B, logits_to_keep, V)`` (sliced here
    when the model computes every position)."""
    position_ids = position_ids_from_mask(attention_mask)  # (B, T)
    kwargs = {"logits_to_keep": logits_to_keep} if logits_to_keep and accepts_logits_to_keep(model) else {}
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, **kwargs
    ).logits
    return logits if logits_to_keep is None else logits[:, -logits_to_keep:]

"""The teacher-forced forward pass that scores sampled responses, at the positions ``generate`` used.

Position ``P - 1 + t`` of a ``(B, P + R)`` row predicts response token ``t``; positions are
``cumsum(mask) - 1`` as in ``generate``, so left padding changes nothing (N details #2), and logprobs
are taken under ``softmax(logits / temperature)`` as the tokens were drawn (N details #7).
"""

from __future__ import annotations

import torch
from torch import nn

from rlhf_lit.functional import log_distributions, token_logprobs
from rlhf_lit.models.generation import Generated
from rlhf_lit.models.packing import pack_rows, packing_applies, place_rows
from rlhf_lit.models.scoring import accepts_logits_to_keep, model_attention_mask, position_ids_from_mask


def forward_with_positions(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    output_hidden_states: bool = False,
    **kwargs,
):
    """One causal-LM forward pass with ``position_ids = cumsum(mask) - 1``, as ``generate`` uses
    (``kwargs``: more arguments of the model's forward, e.g. ``logits_to_keep``).

    Matching the positions of ``generate`` is what makes teacher-forced logprobs equal the
    sampling distribution exactly under left padding (N details #2).
    """
    return model(
        input_ids=input_ids,
        attention_mask=model_attention_mask(model, attention_mask),
        position_ids=position_ids_from_mask(attention_mask),
        output_hidden_states=output_hidden_states,
        use_cache=False,
        **kwargs,
    )


def forward_response_logits(
    model: nn.Module,
    query_responses: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_length: int,
    output_hidden_states: bool = False,
):
    """One forward pass (:func:`forward_with_positions`) that returns only the logits predicting the
    response tokens, ``(B, R, V)``, and the model output (for its hidden states).

    The LM head is applied only at positions ``P - 1 .. P + R - 2`` (``logits_to_keep``): the
    prompt positions' logits are never read, and at a large vocabulary the head is a third of a
    forward pass. A model that ignores ``logits_to_keep`` returns every position; then the
    response positions are sliced out (:func:`response_logits`), with the same result.
    """
    if packing_applies(model, attention_mask):
        return _packed_response_logits(model, query_responses, attention_mask, prompt_length, output_hidden_states)
    total = query_responses.shape[1]
    kwargs = {}
    if accepts_logits_to_keep(model):
        kwargs["logits_to_keep"] = torch.arange(prompt_length - 1, total - 1, device=query_responses.device)  # (R,)
    out = forward_with_positions(model, query_responses, attention_mask, output_hidden_states, **kwargs)
    logits = out.logits if out.logits.shape[1] == total - prompt_length else response_logits(out.logits, prompt_length)
    return logits, out  # (B, R, V)


def _packed_response_logits(
    model: nn.Module,
    query_responses: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_length: int,
    output_hidden_states: bool,
):
    """:func:`forward_response_logits` over the rows packed (:mod:`rlhf_lit.models.packing`): the
    same ``(B, R, V)`` logits (zeros where the predicting position is padding: after a response
    ended, never read), and an output whose ``hidden_states[-1]`` is unpacked to ``(B, T, D)``."""
    rows = pack_rows(query_responses, attention_mask)
    predicting = rows.index[:, prompt_length - 1 : -1]  # (B, R): the packed place of the logits of token t
    keep = predicting[predicting >= 0]  # (K,)
    kwargs = {"logits_to_keep": keep} if accepts_logits_to_keep(model) else {}
    out = model(
        input_ids=rows.input_ids,
        position_ids=rows.position_ids,
        output_hidden_states=output_hidden_states,
        use_cache=False,
        **kwargs,
    )
    kept = out.logits[0] if kwargs else out.logits[0, keep]  # (K, V), in the (B, R) row-major order of ``keep``
    logits = place_rows(kept, predicting >= 0)  # (B, R, V)
    if output_hidden_states:
        out.hidden_states = (*out.hidden_states[:-1], rows.unpack(out.hidden_states[-1]))  # last: (B, T, D)
    return logits, out


def response_distributions(
    model: nn.Module,
    query_responses: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_length: int,
    temperature: float,
) -> torch.Tensor:
    """``(B, R, V)`` log-probabilities of every vocabulary token at each response position under
    ``softmax(logits / temperature)``: the whole next-token distributions :func:`response_logprobs` picks
    the sampled tokens from (the same positions and shift). Called under ``torch.no_grad()``."""
    logits, _ = forward_response_logits(model, query_responses, attention_mask, prompt_length)  # (B, R, V)
    return log_distributions(logits, temperature)  # (B, R, V)


def response_logits(logits: torch.Tensor, prompt_length: int) -> torch.Tensor:
    """The logits that predict the response tokens: position ``P - 1 + t`` predicts token ``P + t``.

    Args:
        logits: ``(B, P + R, V)``.
        prompt_length: P.

    Returns:
        ``(B, R, V)``.
    """
    return logits[:, prompt_length - 1 : -1]  # (B, R, V)


def response_logprobs(model: nn.Module, generated: Generated, temperature: float) -> torch.Tensor:
    """``(B, R)`` logprobs of ``generated``'s response tokens under ``softmax(logits / temperature)``.

    The one place that turns a model and a generation into response logprobs: the positions of
    ``generate`` (:func:`forward_with_positions`), the one-position shift (:func:`forward_response_logits`)
    and the sampling temperature (N details #7). Called under ``torch.no_grad()`` by callers that
    need no gradient.
    """
    ids, mask = generated.query_responses, generated.attention_mask  # (B, P + R) x2
    logits, _ = forward_response_logits(model, ids, mask, generated.prompt_length)  # (B, R, V)
    return token_logprobs(logits, generated.response_ids, temperature)  # (B, R)

"""Response texts of generated batches, decoded one way for every judge in the project."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # only for the annotation: keeps ``import rlhf_lit.evaluation`` light
    from transformers import PreTrainedTokenizerBase


def response_texts(
    tokenizer: PreTrainedTokenizerBase,
    query_responses: torch.Tensor,
    attention_mask: torch.Tensor,
    response_mask: torch.Tensor,
    ended: torch.Tensor,
) -> list[str]:
    """The response texts of a batch, as judges read them: what the PPO stage, the online-generation
    callback and :func:`rlhf_lit.evaluation.samples.sample_and_measure` (``rlhf-lit evaluate``) judge.

    A row's response is its tokens before the first EOS, chosen by position from
    ``response_mask`` and ``ended`` (never by pad id, which may equal a real token or EOS), decoded
    without special tokens. It is cut from the decoded prompt + response so that ``prompt +
    response`` is the text the model produced (decoding the response alone can drop a leading
    space with sentencepiece tokenizers); when the decoded prompt is not a prefix of the whole,
    the response is decoded alone.

    Args:
        tokenizer: the run's tokenizer.
        query_responses: ``(B, P + R)`` prompt (left padded) then response.
        attention_mask: ``(B, P + R)``; only its prompt part ``[:, :P]`` is read.
        response_mask: ``(B, R)`` bool, True up to and including the first EOS.
        ended: ``(B,)`` bool, the response contains EOS.

    Returns:
        ``B`` strings. Costs one device-to-host copy of the ids and masks.
    """
    length, response_length = query_responses.shape[1], response_mask.shape[1]  # P + R, R
    prompt_length = length - response_length  # P
    content = response_mask.sum(1) - ended.long()  # (B,) response tokens before EOS
    packed = torch.cat([query_responses, attention_mask[:, :prompt_length], content[:, None]], 1)
    packed = packed.cpu()  # (B, (P + R) + P + 1): ids, prompt mask and content length in one copy
    ids, prompt_mask = packed[:, :length], packed[:, length : length + prompt_length].bool()  # (B, P + R), (B, P)
    texts = []
    for row, n in enumerate(packed[:, -1].tolist()):
        prompt_ids = ids[row, :prompt_length][prompt_mask[row]].tolist()
        response_ids = ids[row, prompt_length : prompt_length + n].tolist()
        prompt = tokenizer.decode(prompt_ids, skip_special_tokens=True)
        whole = tokenizer.decode(prompt_ids + response_ids, skip_special_tokens=True)
        if whole.startswith(prompt):
            texts.append(whole[len(prompt) :])
        else:
            texts.append(tokenizer.decode(response_ids, skip_special_tokens=True))
    return texts


def prompt_texts(tokenizer: PreTrainedTokenizerBase, rows: Any, skip_special_tokens: bool = False) -> list[str]:
    """Each row's prompt as the policy read it: its attended prompt tokens decoded with the special
    tokens kept as text (a chat template's role markers and generation prompt, a BOS), the text a
    judge reading prompt + response gets (``judge_reads: query_response``).

    Args:
        tokenizer: the run's tokenizer.
        rows: prompts (left padded) then responses: a :class:`~rlhf_lit.models.generation.Generated` or a
            PPO ``Rollout`` (its ``query_responses``, the prompt part of its ``attention_mask``, ``prompt_length``).
        skip_special_tokens: drop the special tokens instead (the prompts a reward function reads).
    """
    ids = rows.query_responses[:, : rows.prompt_length].cpu()  # (B, P)
    real = rows.attention_mask[:, : rows.prompt_length].bool().cpu()  # (B, P)
    if skip_special_tokens:
        return [tokenizer.decode(row[keep].tolist(), skip_special_tokens=True) for row, keep in zip(ids, real)]
    return [rendered_text(tokenizer, row[keep].tolist()) for row, keep in zip(ids, real)]


def rendered_text(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> str:
    """The text whose tokenization (without added specials) is ``ids``, as a chat template rendered it: each
    special token as its own text, each run of other tokens decoded on its own, no clean-up of spaces.

    Decoded whole, a sentencepiece tokenizer writes a space after a special token (``'<s> User: ...'`` for the
    ids of ``'<s>User: ...'``), which a judge tokenizing the text again reads as one more token than the
    policy did."""
    special = set(tokenizer.all_special_ids)
    parts: list[str] = []
    run: list[int] = []
    for token in [*ids, None]:  # None: the end, which closes the last run
        if token is not None and token not in special:
            run.append(token)
            continue
        if run:
            parts.append(tokenizer.decode(run, clean_up_tokenization_spaces=False))
            run = []
        if token is not None:
            parts.append(tokenizer.convert_ids_to_tokens(token))
    return "".join(parts)

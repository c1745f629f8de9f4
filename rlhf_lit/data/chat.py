"""Multi-turn SFT: whole conversations -> token ids, with the loss on the assistant's turns.

A conversation is rendered with the tokenizer's own chat template
(``apply_chat_template(messages, tokenize=False)``) and the rendered text is tokenized once,
without adding special tokens (the template writes its own). The tokens the loss trains on are
the assistant's turns, found in one of two ways:

1. The template's own mask. When the template marks the assistant's text with
   ``{% generation %} ... {% endgeneration %}`` blocks, the trained tokens are transformers'
   ``assistant_masks`` (``return_assistant_tokens_mask=True``): every token that holds a character
   written inside a block. Whatever the template puts inside the block (the end-of-turn token,
   e.g. ``</s>``) is trained, what it puts outside (role headers, newlines) is not. A
   conversation whose mask cannot be used as it is (transformers tokenized other ids, or the mask
   does not hold one run of tokens per assistant message) takes rule 2.
2. The rendering-by-prefix rule, for templates without generation blocks. For assistant message
   ``i`` the template renders ``messages[:i]`` with ``add_generation_prompt=True`` (the context
   and the assistant header) and ``messages[:i + 1]``; the second must start with the first, and
   what it adds is the assistant's turn: its content and whatever the template writes after it
   (an end-of-turn marker), trailing whitespace excluded. A token is trained when its character
   span overlaps the turn's characters (a token straddling the boundary is trained). On a template
   with generation blocks this gives the same tokens as rule 1 when the block holds exactly what
   the assistant's turn adds before any trailing whitespace (tests/data/test_data_chat.py checks it
   on the shipped chat model).

``turns="last"`` trains the last assistant turn only (the earlier ones are context).

Truncation (the single-turn rule of ``rlhf_lit.data.encoding``, applied to a conversation): the
tokens before the first trained token are the prompt, cut from the LEFT to ``max_prompt_length``
(special tokens the encoder puts in front kept there), then the whole sequence is cut at the RIGHT
to ``max_length``. No EOS is appended: the template writes its own end of turn. An example left
with no trained token is dropped.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from rlhf_lit.data.encoding import TextEncoder, truncate_prompt
from rlhf_lit.data.rendering import has_chat_template, tokenizer_name
from rlhf_lit.functional.losses import IGNORE_INDEX

AssistantTurns = Literal["all", "last"]
"""Which assistant turns of a conversation are trained: every one, or the last only."""

GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")
"""A ``{% generation %}`` tag (with or without whitespace control), as transformers detects it."""

Turns = list[list[int]]
"""The trained token positions of a conversation, one list per assistant turn, in order."""


def encode_conversations(
    encoder: TextEncoder,
    conversations: Sequence[Sequence[Mapping[str, str]]],
    *,
    turns: AssistantTurns,
    max_prompt_length: int,
    max_length: int,
    counts: Counter | None = None,
) -> list[dict[str, list[int]]]:
    """SFT items ``{"input_ids", "labels"}`` of whole conversations (see the module docstring).

    Args:
        encoder: the run's encoder; its tokenizer must have a chat template and be a fast tokenizer
            (character offsets).
        conversations: lists of ``{"role", "content"}`` messages (other keys are ignored).
        turns: ``"all"`` trains every assistant turn, ``"last"`` the last one only.
        max_prompt_length: the tokens before the first trained token are cut from the left to this.
        max_length: the whole sequence is cut from the right to this.
        counts: ``counts["prompt"]`` / ``counts["conversation"]`` count the left / right cuts.

    Returns:
        One item per conversation that keeps a trained token (the others are left out; the caller
        counts them). ``labels`` is -100 except on trained tokens, where it is the token id.
    """
    tokenizer = encoder.tokenizer
    convs = [[{"role": m["role"], "content": m["content"]} for m in c] for c in conversations]
    if not convs:
        return []
    require_chat_tokenizer(tokenizer)
    texts = [tokenizer.apply_chat_template(c, tokenize=False) for c in convs]
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    template_turns = _generation_turns(tokenizer, convs, enc["input_ids"])
    items = []
    for k, (conv, text, ids, offsets) in enumerate(zip(convs, texts, enc["input_ids"], enc["offset_mapping"])):
        found = template_turns[k] if template_turns is not None else None
        if found is None:
            found = _prefix_turns(tokenizer, conv, text, offsets, turns)
        chosen = found if turns == "all" else found[-1:]
        trained = [False] * len(ids)
        for positions in chosen:
            for p in positions:
                trained[p] = True
        item = _truncate(list(ids), trained, encoder.prefix, max_prompt_length, max_length, counts)
        if item is not None:
            items.append(item)
    return items


# ------------------------------------------------------------------------- rule 1: the template's
def _generation_turns(
    tokenizer: Any, convs: list[list[dict[str, str]]], ids: list[list[int]]
) -> list[Turns | None] | None:
    """The trained positions per assistant turn from transformers' ``assistant_masks``, per
    conversation; None for all when the template has no generation block, None for one
    conversation whose mask cannot be used as it is (it then takes the prefix rule)."""
    if not GENERATION_BLOCK.search(tokenizer.get_chat_template()):
        return None
    out = tokenizer.apply_chat_template(convs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    result: list[Turns | None] = []
    for conv, own_ids, their_ids, mask in zip(convs, ids, out["input_ids"], out["assistant_masks"]):
        runs = _runs(mask)
        n_assistant = sum(m["role"] == "assistant" for m in conv)
        if list(their_ids) != list(own_ids) or len(runs) != n_assistant:
            # The mask indexes the ids transformers tokenized; when they differ from ours (a
            # tokenizer whose call is customised) its positions mean nothing here. And it must
            # hold one run of tokens per assistant message: transformers stops marking at a block
            # whose first character maps to no token and marks to the end of the sequence from a
            # block whose last character maps to none, and turns="last" needs the turns apart.
            # Either way the prefix rule decides this conversation (or says why it cannot).
            result.append(None)
        else:
            result.append(runs)
    return result


def _runs(mask: Sequence[int]) -> Turns:
    """The maximal runs of consecutive 1s of a 0/1 mask, as position lists."""
    runs: Turns = []
    for p, m in enumerate(mask):
        if m:
            if runs and runs[-1][-1] == p - 1:
                runs[-1].append(p)
            else:
                runs.append([p])
    return runs


# ------------------------------------------------------------------------ rule 2: by prefix
def _prefix_turns(
    tokenizer: Any, conv: list[dict[str, str]], text: str, offsets: Sequence[tuple[int, int]], turns: AssistantTurns
) -> Turns:
    """The trained positions per assistant turn by the rendering-by-prefix rule (the module
    docstring); with ``turns="last"`` only the last turn is rendered and returned."""
    indices = [i for i, m in enumerate(conv) if m["role"] == "assistant"]
    if turns == "last":
        indices = indices[-1:]
    found: Turns = []
    for i in indices:
        start, end = _assistant_span(tokenizer, conv, text, i)
        # Tokens whose characters [s, e) overlap the turn's [start, end): a token straddling the
        # start (e.g. '▁He' when the header ends with a space) carries the response's first
        # characters and is trained.
        found.append([p for p, (s, e) in enumerate(offsets) if s < end and e > start])
    return found


def _assistant_span(tokenizer: Any, conv: list[dict[str, str]], text: str, i: int) -> tuple[int, int]:
    """The characters of ``text`` (the whole conversation rendered) that assistant message ``i``
    adds after the generation prompt, trailing whitespace excluded."""

    def cannot_split(why: str) -> ValueError:
        return ValueError(
            f"the chat template of tokenizer {tokenizer_name(tokenizer)!r} cannot be split into turns: {why}; the "
            "assistant's tokens are found by rendering the conversation up to each assistant "
            "message, so use a template that renders turns as continuations, or one that marks "
            "the assistant's text with {% generation %} blocks"
        )

    if i == 0:
        raise cannot_split(
            "the conversation starts with an assistant message, so there is no generation prompt before it to render"
        )
    before = tokenizer.apply_chat_template(conv[:i], tokenize=False, add_generation_prompt=True)
    upto = tokenizer.apply_chat_template(conv[: i + 1], tokenize=False)
    if not upto.startswith(before):
        raise cannot_split(
            f"the rendering of messages[:{i + 1}] does not start with the rendering "
            f"of messages[:{i}] with add_generation_prompt=True"
        )
    if not text.startswith(upto):
        raise cannot_split(
            f"the rendering of the whole conversation does not start with the rendering of messages[:{i + 1}]"
        )
    return len(before), len(upto.rstrip())


def require_chat_tokenizer(tokenizer: Any) -> None:
    """A chat template to render with, and character offsets (only fast tokenizers give them),
    which both rules read."""
    if not has_chat_template(tokenizer):
        raise ValueError(
            f"the data is conversational but the tokenizer {tokenizer_name(tokenizer)!r} has no chat "
            "template; conversations are rendered with the tokenizer's own template, so use a "
            "tokenizer that has one"
        )
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            f"tokenizer {tokenizer_name(tokenizer)!r} is not a fast tokenizer: multi-turn SFT finds the "
            "assistant's tokens from character offsets, which only fast tokenizers give"
        )


# ------------------------------------------------------------------------------- truncation
def _truncate(
    ids: list[int],
    trained: list[bool],
    prefix: list[int],
    max_prompt_length: int,
    max_length: int,
    counts: Counter | None,
) -> dict[str, list[int]] | None:
    """The truncation rule of the module docstring; None when no trained token is left."""
    first = next((p for p, t in enumerate(trained) if t), None)
    if first is None:
        return None
    prompt = truncate_prompt(ids[:first], prefix, max_prompt_length, counts)
    ids = prompt + ids[first:]
    trained = [False] * len(prompt) + trained[first:]
    cut = len(ids) > max_length
    ids, trained = ids[:max_length], trained[:max_length]
    if not any(trained):
        return None  # a dropped example is counted by the caller, not as a cut (as encode_sft does)
    if cut and counts is not None:
        counts["conversation"] += 1
    return {"input_ids": ids, "labels": [t if keep else IGNORE_INDEX for t, keep in zip(ids, trained)]}

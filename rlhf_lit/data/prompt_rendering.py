"""The one rule for prompts that reach a policy outside the training data: ``rlhf-lit evaluate``,
``rlhf-lit best-of-n``, the ``OnlineGeneration`` callback and the guard's held-out prompts.

A conversational prompt (a list of messages) is always rendered with the tokenizer's chat template
and its generation prompt. A plain-string prompt is rendered as one user turn as
the option (``chat_template``, ``--chat-template``) says, in the one vocabulary of
:data:`rlhf_lit.data.rendering.TemplateChoice` that ``hh_render`` speaks too: ``auto`` (the
default) when the tokenizer has a chat template, ``always`` (a tokenizer without a template is
refused), ``never`` (kept as the string it is); ``chat_template`` and ``raw`` are deprecated aliases
of ``always`` and ``never``, removed in 0.3.0. Rendering and tokenizing are the data modules'
(:class:`rlhf_lit.data.encoding.TextEncoder`), and ``auto`` is the data modules' ``chat_template: auto``
on string prompts, so a chat model is sampled in the template it was trained in, its BOS written once:
prompts read from a source (:mod:`rlhf_lit.data.prompt_source`) keep the strings of the formats a data
module's ``auto`` keeps (:data:`~rlhf_lit.data.rendering.KEPT_BY_AUTO`: HH transcripts follow ``hh_render``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from rlhf_lit.data.conversation import TextOrConversation, is_conversation
from rlhf_lit.data.encoding import TextEncoder
from rlhf_lit.data.rendering import (
    KEPT_BY_AUTO,
    TemplateOption,
    TemplateRendering,
    renders_strings,
    resolve_template,
    template_choice,
)


class RenderedPrompts(NamedTuple):
    """Prompts as the policy reads them: ``texts`` (the rendered text, the plain string itself when
    not rendered) and ``ids`` (its token ids, the tokenizer's specials in front of plain strings);
    ``end_of_turn``: the id the chat template ends an assistant turn with when any prompt was rendered
    with it (:meth:`~rlhf_lit.data.encoding.TextEncoder.end_of_turn_id`: what a reward model trained on
    those conversations read at the end of every response), else None (the EOS ends a response)."""

    texts: list[str]
    ids: list[list[int]]
    end_of_turn: int | None = None


def rendering_line(where: str, rendering: TemplateRendering, prompts: Sequence[TextOrConversation]) -> str:
    """The one log line saying how ``where``'s prompts reach the policy, and why."""
    conversations = sum(map(is_conversation, prompts))
    strings = len(prompts) - conversations
    parts = []
    if strings:
        how = "rendered as one user turn with the chat template" if rendering.chat else "kept as plain strings"
        parts.append(f"{strings} string prompt(s) {how} ({rendering.why})")
    if conversations:
        parts.append(f"{conversations} conversational prompt(s) rendered with the chat template")
    return f"{where}: " + "; ".join(parts)


def prompt_rendering(
    option: TemplateOption, tokenizer: Any, name: str, format: str | None = None, training: bool | None = None
) -> TemplateRendering:
    """How string prompts read in ``format`` (None: given as a list) reach the policy: the option ``name``
    resolved for ``tokenizer`` (:func:`~rlhf_lit.data.rendering.resolve_template`, ``training`` as it takes it),
    but under ``auto`` the strings of :data:`~rlhf_lit.data.rendering.KEPT_BY_AUTO` formats kept, as a data module
    keeps them (:func:`~rlhf_lit.data.rendering.renders_strings`)."""
    rendering = resolve_template(option, tokenizer, name, training=training)
    if format is None or renders_strings(rendering, template_choice(option, name), format) == rendering.chat:
        return rendering
    return TemplateRendering(False, f"{rendering.why}; format {format}: {KEPT_BY_AUTO[format]}")


def render_prompts(
    tokenizer: Any, prompts: Sequence[TextOrConversation], rendering: TemplateRendering
) -> RenderedPrompts:
    """``prompts`` rendered and tokenized by the rule of the module docstring (a conversation with a
    tokenizer that has no template: the data modules' one error)."""
    encoder = TextEncoder(tokenizer, apply_chat_template=rendering.chat)  # a conversation: its template required
    texts, ids = [encoder.render_prompt(p) for p in prompts], encoder.encode_prompts(prompts)
    templated = rendering.chat or any(map(is_conversation, prompts))
    end_of_turn = TextEncoder(tokenizer, apply_chat_template=True).end_of_turn_id() if templated else None
    return RenderedPrompts(texts, ids, end_of_turn)

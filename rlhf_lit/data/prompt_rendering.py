"""The one rule for prompts that reach a policy outside the training data: ``rlhf-lit evaluate``,
``rlhf-lit best-of-n``, the ``OnlineGeneration`` callback and the guard's held-out prompts.

A conversational prompt (a list of messages) is always rendered with the tokenizer's chat template
and its generation prompt. A plain-string prompt is rendered as one user turn as
:data:`ChatTemplate` says: ``auto`` (the default) when the tokenizer has a chat template, as
``hh_render: auto`` does for HH-RLHF transcripts, ``always`` (a tokenizer without a template is
refused), ``never`` (kept as the string it is). Rendering and tokenizing are the data modules'
(:class:`rlhf_lit.data.encoding.TextEncoder`, the same as ``apply_chat_template: true``), so a chat
model is sampled in the template it was trained in, its BOS written once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, NamedTuple, get_args

from rlhf_lit.data.conversation import TextOrConversation, is_conversation
from rlhf_lit.data.encoding import TextEncoder
from rlhf_lit.data.rendering import has_chat_template, tokenizer_name

ChatTemplate = Literal["auto", "always", "never"]
"""Whether plain-string prompts are rendered with the tokenizer's chat template: ``auto`` when it
has one, ``always`` (refused without one), ``never``. Conversational prompts always are."""

CHAT_TEMPLATE_CHOICES: tuple[str, ...] = get_args(ChatTemplate)
"""The values of :data:`ChatTemplate`, for option parsers and messages."""


class PromptRendering(NamedTuple):
    """What a :data:`ChatTemplate` option resolved to for one tokenizer, and why (logged once)."""

    chat: bool
    why: str


class RenderedPrompts(NamedTuple):
    """Prompts as the policy reads them: ``texts`` (the rendered text, the plain string itself when
    not rendered) and ``ids`` (its token ids, the tokenizer's specials in front of plain strings)."""

    texts: list[str]
    ids: list[list[int]]


def check_chat_template(option: str, name: str = "chat_template") -> None:
    """Refuse a value that is not a :data:`ChatTemplate` (``ValueError`` naming the option ``name``)."""
    if option not in CHAT_TEMPLATE_CHOICES:
        raise ValueError(f"{name} must be one of {', '.join(CHAT_TEMPLATE_CHOICES)}; got {option!r}")


def resolve_chat_template(
    option: ChatTemplate, tokenizer: Any, name: str = "chat_template", training: bool | None = None
) -> PromptRendering:
    """``option`` (given as ``name``, e.g. ``--chat-template``) for ``tokenizer``; ``ValueError`` naming
    ``name`` for an unknown value, or ``always`` with a tokenizer that has no chat template.

    ``training``: whether the run's training prompts were rendered with the template (a data
    module's ``chat_rendered``), when known. ``auto`` then follows it, so prompts sampled beside
    training (the callbacks, the guard's held-out set) read as the training prompts did, and the
    reward model scores the rendering it is trained against."""
    check_chat_template(option, name)
    template, tok = has_chat_template(tokenizer), tokenizer_name(tokenizer)
    if option == "never":
        return PromptRendering(False, f"{name} never")
    if option == "always":
        if not template:
            raise ValueError(
                f"{name} always, but the tokenizer {tok!r} has no chat template to render the prompts with; "
                f"use {name} auto (or never) to keep them as plain strings, or a tokenizer that has one"
            )
        return PromptRendering(True, f"{name} always")
    if training is not None:
        how = "rendered with" if training else "kept outside"
        why = f"{name} auto, and the training prompts are {how} the chat template"
        return PromptRendering(training and template, why)
    has = "has a" if template else "has no"
    return PromptRendering(template, f"{name} auto, and the tokenizer {tok!r} {has} chat template")


def rendering_line(where: str, rendering: PromptRendering, prompts: Sequence[TextOrConversation]) -> str:
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


def render_prompts(
    tokenizer: Any, prompts: Sequence[TextOrConversation], rendering: PromptRendering
) -> RenderedPrompts:
    """``prompts`` rendered and tokenized by the rule of the module docstring (a conversation with a
    tokenizer that has no template: the data modules' one error)."""
    encoder = TextEncoder(tokenizer, apply_chat_template=rendering.chat)
    if any(map(is_conversation, prompts)):
        encoder.require_chat_template()
    return RenderedPrompts([encoder.render_prompt(p) for p in prompts], encoder.encode_prompts(prompts))

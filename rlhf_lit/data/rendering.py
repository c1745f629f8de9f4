"""Whether string data meets the tokenizer's chat template: the ``hh_render`` choice for HH-RLHF
transcripts, and the one warning for plain-string prompts given to a model that has a template.

A model with a chat template (an instruction model, ``assets/models/stories260K-chat``) answers
inside its template; trained or sampled on prompts written outside it, it learns to write both
sides of a dialogue. Conversations are always rendered with the template
(:mod:`rlhf_lit.data.encoding`); strings are not, unless a data module's ``apply_chat_template`` or,
for ``hh_rlhf`` transcripts, ``hh_render`` says so. Prompts that reach a policy outside the data
modules (the commands, the callbacks) follow :mod:`rlhf_lit.data.prompt_rendering`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

from rlhf_lit.data.conversation import is_conversation
from rlhf_lit.data.example import Example

HHRender = Literal["auto", "chat_template", "raw"]
"""How ``hh_rlhf`` transcripts are rendered: ``chat_template`` reads them as conversations that the
tokenizer's chat template renders (:mod:`rlhf_lit.data.hh`), ``raw`` keeps them as the strings they
are, ``auto`` (the default) is ``chat_template`` when the tokenizer has a template, else ``raw``."""


class HHRendering(NamedTuple):
    """What ``hh_render`` resolved to for one tokenizer, and why (the data module logs it)."""

    conversations: bool
    why: str


def tokenizer_name(tokenizer: Any) -> str:
    """The tokenizer's name or path, for messages (its class name when it has none)."""
    return getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__


def has_chat_template(tokenizer: Any) -> bool:
    """Whether the tokenizer carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def resolve_hh_render(option: HHRender, tokenizer: Any) -> HHRendering:
    """``option`` for ``tokenizer``: ``auto`` follows whether it has a chat template; ``chat_template``
    without one is refused (``ValueError`` naming the option)."""
    name, template = tokenizer_name(tokenizer), has_chat_template(tokenizer)
    if option == "raw":
        return HHRendering(False, "hh_render: raw")
    if option == "chat_template":
        if not template:
            raise ValueError(
                f"hh_render: chat_template, but the tokenizer {name!r} has no chat template to render HH-RLHF "
                "transcripts with; set hh_render: raw (or auto) to keep them as strings, or use a tokenizer that "
                "has one"
            )
        return HHRendering(True, "hh_render: chat_template")
    if option != "auto":
        raise ValueError(f"hh_render must be one of auto, chat_template, raw; got {option!r}")
    if template:
        return HHRendering(True, f"hh_render: auto, and the tokenizer {name!r} has a chat template")
    return HHRendering(False, f"hh_render: auto, and the tokenizer {name!r} has no chat template")


def hh_rendering_line(source: str, rendering: HHRendering) -> str:
    """The one log line saying how a data module rendered the HH transcripts of ``source``, and why."""
    how = ("read as conversations and rendered with the tokenizer's chat template" if rendering.conversations
           else "kept as raw strings (split at the last '\\n\\nAssistant:')")  # fmt: skip
    return f"{source}: hh_rlhf transcripts {how} ({rendering.why})"


def raw_prompt_warning(tokenizer: Any, format: str, examples: Sequence[Example], apply_chat_template: bool) -> str | None:
    """The warning for plain-string prompts (``examples`` of one data module, read in ``format``)
    given to a tokenizer with a chat template that will not render them; None when nothing is amiss.

    The warning names the option that would render them: ``hh_render`` for HH transcripts kept raw,
    ``apply_chat_template`` for other string prompts; language-modelling text (``text``) has no
    prompt to render, so it says to supply conversational records instead."""
    if apply_chat_template or not has_chat_template(tokenizer):
        return None
    if not any(e.messages is None and not is_conversation(e.prompt) for e in examples):
        return None
    head = f"the tokenizer {tokenizer_name(tokenizer)!r} has a chat template, but"
    if format == "hh_rlhf":
        return (f"{head} the hh_rlhf transcripts are kept as raw strings (hh_render: raw): the model is trained and "
                "sampled outside its template; set hh_render: auto (or chat_template) to render them with it")  # fmt: skip
    if format == "text":
        return (f"{head} format text gives plain strings, which are not rendered with the chat template (language "
                "modelling has no turns); to train inside the template, give conversational records (messages)")  # fmt: skip
    return (f"{head} the {format} prompts are plain strings, not rendered with the chat template: the model is trained "
            "and sampled outside it; set apply_chat_template: true to render each as one user turn, or give "
            "conversational records (lists of messages)")  # fmt: skip

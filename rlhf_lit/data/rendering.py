"""Whether string data meets the tokenizer's chat template: the one vocabulary every option that
decides it speaks (:data:`TemplateChoice`, read by :func:`template_choice`: both defined in
:mod:`rlhf_lit.tokenizer`, below the stages that compare them on resume, and re-exported here;
resolved by :func:`resolve_template`), and the one warning for plain-string prompts given to a model
that has a template.

A model with a chat template (an instruction model, ``assets/models/stories260K-chat``) answers
inside its template; trained or sampled on prompts written outside it, it learns to write both
sides of a dialogue. Conversations are always rendered with the template
(:mod:`rlhf_lit.data.encoding`); strings as the options below say:

- ``chat_template`` (every data module): string prompts as one user turn, string responses as the
  assistant's (:func:`renders_strings`: ``auto`` keeps the strings of :data:`KEPT_BY_AUTO` as they are);
- ``hh_render`` (every data module): ``hh_rlhf`` transcripts;
- ``chat_template`` (``OnlineGeneration``, the guard's ``held_out``, the evaluation functions) and
  ``--chat-template`` (``rlhf-lit evaluate``, ``best-of-n``): string prompts outside the data modules
  (:mod:`rlhf_lit.data.prompt_rendering`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, NamedTuple

from rlhf_lit.data.conversation import is_conversation
from rlhf_lit.data.example import Example

# the vocabulary of rlhf_lit.tokenizer, re-exported: the data package and the commands read it from here
from rlhf_lit.tokenizer import TEMPLATE_ALIASES, TEMPLATE_CHOICES, TemplateChoice, TemplateOption, template_choice  # noqa: F401


class TemplateRendering(NamedTuple):
    """What a :data:`TemplateChoice` option resolved to for one tokenizer, and why (logged once):
    ``chat``, whether strings are rendered with the chat template."""

    chat: bool
    why: str


def tokenizer_name(tokenizer: Any) -> str:
    """The tokenizer's name or path, for messages (its class name when it has none)."""
    return getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__


def has_chat_template(tokenizer: Any) -> bool:
    """Whether the tokenizer carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def said(name: str, value: str) -> str:
    """The option as a user wrote it: ``key: value`` for a config key, ``--flag value`` otherwise."""
    return f"{name}: {value}" if name.isidentifier() else f"{name} {value}"


def resolve_template(
    option: TemplateOption, tokenizer: Any, name: str, what: str = "the prompts", training: bool | None = None
) -> TemplateRendering:
    """``option`` (the option ``name``, e.g. ``hh_render`` or ``--chat-template``) for ``tokenizer``:
    ``auto`` follows whether it has a chat template; ``ValueError`` naming ``name`` for an unknown
    value, or ``always`` with a tokenizer that has none (``what``: the strings it would render).

    ``training``: whether the run's training prompts were rendered with the template (a data
    module's ``chat_rendered``), when known. ``auto`` then follows it, so prompts sampled beside
    training (the callbacks, the guard's held-out set) read as the training prompts did, and the
    reward model scores the rendering it is trained against."""
    choice = template_choice(option, name)
    template, tok = has_chat_template(tokenizer), tokenizer_name(tokenizer)
    given = said(name, option)  # as written: an alias reads as the user wrote it
    if choice == "never":
        return TemplateRendering(False, given)
    if choice == "always":
        if not template:
            raise ValueError(
                f"{given}, but the tokenizer {tok!r} has no chat template to render {what} with; use "
                f"{said(name, 'never')} (or auto) to keep them as strings, or a tokenizer that has one"
            )
        return TemplateRendering(True, given)
    if training is not None:
        how = "rendered with" if training else "kept outside"
        why = f"{given}, and the training prompts are {how} the chat template"
        return TemplateRendering(training and template, why)
    has = "has a" if template else "has no"
    return TemplateRendering(template, f"{given}, and the tokenizer {tok!r} {has} chat template")


def hh_rendering_line(source: str, rendering: TemplateRendering) -> str:
    """The one log line saying how a data module rendered the HH transcripts of ``source``, and why."""
    how = (
        "read as conversations and rendered with the tokenizer's chat template"
        if rendering.chat
        else "kept as raw strings (split at the last '\\n\\nAssistant:')"
    )
    return f"{source}: hh_rlhf transcripts {how} ({rendering.why})"


KEPT_BY_AUTO = {"hh_rlhf": "its transcripts follow hh_render", "text": "language modelling has no turns"}
"""The formats whose strings a data module's ``chat_template: auto`` keeps as they are, and why."""


def holds_strings(example: Example) -> bool:
    """Whether ``example`` is made of strings (not a conversation), which ``chat_template`` may render."""
    return example.messages is None and not is_conversation(example.prompt)


def renders_strings(rendering: TemplateRendering, choice: TemplateChoice, format: str) -> bool:
    """Whether a data module renders the strings of a source read in ``format``: its ``chat_template``
    (``choice``) resolved for the tokenizer (``rendering``), but for ``auto`` the formats of :data:`KEPT_BY_AUTO`."""
    return rendering.chat and not (choice == "auto" and format in KEPT_BY_AUTO)


def string_rendering_line(source: str, format: str, chat: bool, rendering: TemplateRendering) -> str:
    """The one log line saying how a data module reads the strings of ``source`` (read in ``format``), and why."""
    how = "rendered as turns with the tokenizer's chat template" if chat else "kept as plain strings"
    why = rendering.why if chat or not rendering.chat else f"{rendering.why}; format {format}: {KEPT_BY_AUTO[format]}"
    return f"{source}: the {format} strings are {how} ({why})"


def recorded_choice(choice: TemplateChoice, rendered: Collection[bool]) -> TemplateChoice:
    """What a data module's hyperparameters record of ``chat_template`` after ``setup`` (``rendered``: for
    each source of string examples, whether they were rendered): the choice under which the strings read as
    they did, so the resume check compares it with a checkpoint's ``apply_chat_template`` too (the deprecated
    alias, removed in 0.3.0; true: ``always``, false: ``never``). ``auto`` only for a mix (a ``text`` ptx
    source beside rendered prompts)."""
    if choice == "always" or (rendered and all(rendered)):
        return "always"
    return "auto" if any(rendered) else "never"


def raw_prompt_warning(tokenizer: Any, format: str, examples: Sequence[Example], chat: bool) -> str | None:
    """The warning for plain-string prompts (``examples`` of one data module, read in ``format``)
    given to a tokenizer with a chat template that will not render them (``chat`` False); None when
    nothing is amiss.

    The warning names the option that would render them: ``hh_render`` for HH transcripts kept raw,
    ``chat_template`` for other string prompts; language-modelling text (``text``) has no
    prompt to render, so it says to supply conversational records instead."""
    if chat or not has_chat_template(tokenizer):
        return None
    if not any(map(holds_strings, examples)):
        return None
    head = f"the tokenizer {tokenizer_name(tokenizer)!r} has a chat template, but"
    if format == "hh_rlhf":
        return (
            f"{head} the hh_rlhf transcripts are kept as raw strings (hh_render: never): the model is trained and "
            "sampled outside its template; set hh_render: auto (or always) to render them with it"
        )
    if format == "text":
        return (
            f"{head} format text gives plain strings, which are not rendered with the chat template (language "
            "modelling has no turns); to train inside the template, give conversational records (messages)"
        )
    return (
        f"{head} the {format} prompts are plain strings, kept outside the chat template (chat_template: never): the "
        "model is trained and sampled outside it; set chat_template: auto (or always) to render each as one user "
        "turn, or give conversational records (lists of messages)"
    )

"""Anthropic HH-RLHF transcripts (format ``hh_rlhf``): ``{"chosen", "rejected"}``, each a whole
dialogue ``\\n\\nHuman: ... \\n\\nAssistant: ... \\n\\nHuman: ... \\n\\nAssistant: ...``.

Two readings; the data module's ``hh_render`` picks one (:mod:`rlhf_lit.data.rendering`) and
passes it as ``AdapterOptions.hh_conversations``:

- **Conversations** (``hh_render: auto`` with a tokenizer that has a chat template, or
  ``always``): the transcript is split at its ``\\n\\nHuman:`` / ``\\n\\nAssistant:`` markers
  into user / assistant messages, each the text after its marker without the one space that follows
  it. The prompt is every turn before the last assistant turn (it ends on the user's turn), the
  response that last turn, one assistant message; the encoder renders both with the tokenizer's
  chat template, so the model is trained and sampled inside its own template and never sees the
  ``Human:`` markers. A transcript whose turns are not Human, Assistant, Human, ..., Assistant (text
  before the first Human turn, two turns of one role in a row, an empty turn before the last, a last
  turn of the Human) is skipped and counted, as the strings' reading skips its malformed records.
- **Strings** (``auto`` without a chat template, or ``never``; the only reading before ``hh_render``
  existed): split at the LAST ``\\n\\nAssistant:``; the prompt is everything up to and including that
  marker, the response what follows it.

In both, preference pairs whose chosen and rejected differ before their last assistant turn, and
SFT or preference examples whose last assistant turn is empty, are skipped and counted. SFT
examples are prompt + chosen and prompts are the prompt of the chosen transcript (the rejected
transcript is not read for these).
"""

from __future__ import annotations

import re

from rlhf_lit.data.conversation import Conversation
from rlhf_lit.data.example import AdapterOptions, Example, Fields, Kind, Skip
from rlhf_lit.data.records import Row, get_text

HH_HUMAN = "\n\nHuman:"
HH_ASSISTANT = "\n\nAssistant:"
_MARKER = re.compile(r"\n\n(Human|Assistant):")
_ROLE = {"Human": "user", "Assistant": "assistant"}
NOT_SHARED = f"chosen and rejected do not share the prompt up to the last {HH_ASSISTANT!r}"
"""The skip reason of a pair whose transcripts differ before their last assistant turn."""


def split_hh(transcript: str) -> tuple[str, str] | None:
    """(prompt including the last ``\\n\\nAssistant:``, response after it), or None if absent."""
    cut = transcript.rfind(HH_ASSISTANT)
    if cut < 0:
        return None
    cut += len(HH_ASSISTANT)
    return transcript[:cut], transcript[cut:]


def hh_turns(transcript: str, name: str) -> Conversation:
    """The messages of an HH transcript (the record's field ``name``), its last assistant turn
    possibly empty (the caller decides whether it reads it).

    Raises :class:`Skip` naming ``name`` unless the turns read Human, Assistant, Human, ...,
    Assistant with nothing but whitespace before the first one and no empty turn before the last."""
    parts = _MARKER.split(transcript)
    head, markers, bodies = parts[0], parts[1::2], parts[2::2]
    if "Assistant" not in markers:
        raise Skip(f"no {HH_ASSISTANT!r} in {name}")
    if head.strip() or markers[0] != "Human":
        raise Skip(f"{name} does not open with a {HH_HUMAN!r} turn")
    if any(a == b for a, b in zip(markers, markers[1:])):
        raise Skip(f"{name} has two turns of one role in a row (turns must alternate Human, Assistant)")
    if markers[-1] != "Assistant":
        raise Skip(f"{name} ends on a Human turn (no assistant response after it)")
    # the marker is followed by one space in HH's own records; more belongs to the text
    contents = [body[1:] if body.startswith(" ") else body for body in bodies]
    if any(not content.strip() for content in contents[:-1]):
        raise Skip(f"{name} has an empty turn before its last")
    return tuple({"role": _ROLE[m], "content": c} for m, c in zip(markers, contents))


def _require_response(text: str, name: str) -> str:
    """``text``, or :class:`Skip` when it is blank (an empty last assistant turn)."""
    if not text.strip():
        raise Skip(f"empty {name} after the last {HH_ASSISTANT!r}")
    return text


def _as_strings(row: Row, kind: Kind, f: Fields) -> Example:
    """The transcripts split at their last ``\\n\\nAssistant:`` (the reading before ``hh_render``, kept as it was)."""
    chosen = get_text(row, f.chosen)
    parts = split_hh(chosen)
    if parts is None:
        raise Skip(f"no {HH_ASSISTANT!r} in chosen")
    prompt, chosen_response = parts
    if kind == "prompt":
        return Example(row.where, prompt)
    if kind == "sft":
        return Example(row.where, prompt, response=_require_response(chosen_response, "chosen"))
    rejected_parts = split_hh(get_text(row, f.rejected))
    if rejected_parts is None or rejected_parts[0] != prompt:
        raise Skip(NOT_SHARED)
    return Example(
        row.where,
        prompt,
        chosen=_require_response(chosen_response, "chosen"),
        rejected=_require_response(rejected_parts[1], "rejected"),
    )


def _response(turns: Conversation, name: str) -> Conversation:
    """The last (assistant) turn of ``turns`` as a response, or :class:`Skip` when it is empty."""
    _require_response(turns[-1]["content"], name)
    return turns[-1:]


def _as_conversations(row: Row, kind: Kind, f: Fields) -> Example:
    """The transcripts as conversations: the prompt the turns before the last assistant turn, the
    response that turn (one assistant message)."""
    chosen = hh_turns(get_text(row, f.chosen), "chosen")
    prompt = chosen[:-1]
    if kind == "prompt":
        return Example(row.where, prompt)
    if kind == "sft":
        return Example(row.where, prompt, response=_response(chosen, "chosen"))
    rejected = hh_turns(get_text(row, f.rejected), "rejected")
    if rejected[:-1] != prompt:
        raise Skip(NOT_SHARED)
    return Example(row.where, prompt, chosen=_response(chosen, "chosen"), rejected=_response(rejected, "rejected"))


def hh_rlhf(row: Row, kind: Kind, opt: AdapterOptions) -> Example:
    """An HH-RLHF record as a ``kind`` example, its transcripts read as conversations or strings
    (``opt.hh_conversations``; see the module docstring)."""
    read = _as_conversations if opt.hh_conversations else _as_strings
    return read(row, kind, opt.fields)

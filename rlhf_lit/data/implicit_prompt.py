"""Format ``implicit_prompt``: ``{"chosen", "rejected"}`` only, the prompt being what both share at their
start (see :mod:`rlhf_lit.data.adapters` for the rule): for conversations their longest shared run of
whole messages, for strings their longest common prefix moved back to its last whitespace."""

from __future__ import annotations

from rlhf_lit.data.conversation import (
    Conversation,
    get_text_or_conversation,
    is_conversation,
    require_prompt_end,
    require_response_start,
    shared_turns,
    shared_words,
)
from rlhf_lit.data.example import AdapterOptions, Example, Fields, Kind
from rlhf_lit.data.record_parts import pair
from rlhf_lit.data.records import InvalidRecord, Row


def _implicit_conversations(
    row: Row, f: Fields, chosen: Conversation, rejected: Conversation
) -> tuple[Conversation, Conversation, Conversation]:
    """(prompt, chosen, rejected): the prompt is the whole messages both share at their start."""
    n = shared_turns(chosen, rejected)
    if n == 0:
        raise InvalidRecord(
            f"{row.where}: fields {f.chosen!r} and {f.rejected!r} share no first turn; an implicit prompt is the "
            "messages both start with"
        )
    for name, conversation in ((f.chosen, chosen), (f.rejected, rejected)):
        if len(conversation) == n:
            raise InvalidRecord(
                f"{row.where}: field {name!r} has no message after the {n} it shares with the other; a response "
                "must follow the shared prompt"
            )
        require_response_start(row, name, conversation[n:], offset=n)
    require_prompt_end(row, f.chosen, chosen[:n])
    return chosen[:n], chosen[n:], rejected[n:]


def _implicit_strings(row: Row, f: Fields, chosen: str, rejected: str) -> tuple[str, str, str]:
    """(prompt, chosen, rejected): the prompt is the common prefix up to its last whitespace, which
    starts the responses."""
    n = shared_words(chosen, rejected)
    if n == 0 or not chosen[:n].strip():
        raise InvalidRecord(
            f"{row.where}: fields {f.chosen!r} and {f.rejected!r} share no whole word at their start; an implicit "
            "prompt is the text both start with"
        )
    for name, text in ((f.chosen, chosen), (f.rejected, rejected)):
        if not text[n:].strip():
            raise InvalidRecord(
                f"{row.where}: field {name!r} has nothing after the prompt both share ({chosen[:n]!r}); a response "
                "must follow it"
            )
    return chosen[:n], chosen[n:], rejected[n:]


def implicit_prompt(row: Row, kind: Kind, opt: AdapterOptions) -> Example:
    """``chosen`` and ``rejected`` only; the prompt is what both start with (see the module docstring)."""
    f = opt.fields
    chosen, rejected = get_text_or_conversation(row, f.chosen), get_text_or_conversation(row, f.rejected)
    if is_conversation(chosen) != is_conversation(rejected):
        raise InvalidRecord(
            f"{row.where}: fields {f.chosen!r} and {f.rejected!r} must both be strings or both conversations to "
            "share an implicit prompt"
        )
    if chosen == rejected:
        raise InvalidRecord(f"{row.where}: fields {f.chosen!r} and {f.rejected!r} are the same; a pair must differ")
    split = _implicit_conversations if is_conversation(chosen) else _implicit_strings
    prompt, chosen, rejected = split(row, f, chosen, rejected)  # type: ignore[arg-type]
    if kind == "prompt":
        return Example(row.where, prompt)
    if kind == "sft":
        return Example(row.where, prompt, response=chosen)
    return pair(row, f, prompt, chosen, rejected)

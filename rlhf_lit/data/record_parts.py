"""The parts every format adapter builds an :class:`~rlhf_lit.data.example.Example` from: a record's
prompt and responses read as strings or conversations (:func:`get_prompt`, :func:`get_response`), a
pair made of them (:func:`pair`), and an example made all strings or all conversations
(:func:`conversational`; see "Conversations" in :mod:`rlhf_lit.data.adapters`)."""

from __future__ import annotations

from dataclasses import replace

from rlhf_lit.data.conversation import (
    Conversation,
    TextOrConversation,
    as_prompt,
    as_response,
    get_text_or_conversation,
    is_conversation,
    require_prompt_end,
    require_response_start,
)
from rlhf_lit.data.example import Example, Fields
from rlhf_lit.data.records import InvalidRecord, Row, get_finite_number


def conversational(example: Example) -> Example:
    """``example`` with its strings as messages when any of its prompt and responses is a conversation
    (a string prompt becomes one user message, a string response one assistant message), so that
    its responses all follow one rendering of the prompt; else ``example`` itself."""
    responses = [example.response, example.chosen, example.rejected, *(example.responses or ())]
    if not any(is_conversation(x) for x in [example.prompt, *responses]):
        return example

    def response(x: TextOrConversation | None) -> Conversation | None:
        return None if x is None else as_response(x)

    return replace(
        example,
        prompt=as_prompt(example.prompt),
        response=response(example.response),
        chosen=response(example.chosen),
        rejected=response(example.rejected),
        responses=None if example.responses is None else tuple(as_response(r) for r in example.responses),
    )


def get_prompt(row: Row, field: str) -> TextOrConversation:
    """The prompt in ``row.data[field]``: a string, or a conversation ending on the user's turn."""
    prompt = get_text_or_conversation(row, field)
    if is_conversation(prompt):
        require_prompt_end(row, field, prompt)  # type: ignore[arg-type]
    return prompt


def get_response(row: Row, field: str, prompt: TextOrConversation | None = None) -> TextOrConversation:
    """A response in ``row.data[field]``: a string, or a conversation opening on the assistant's message.

    A conversation that repeats the record's ``prompt`` (as messages) at its start is read without it:
    some Hub pair sets (e.g. HuggingFaceH4/ultrafeedback_binarized) store ``prompt`` as a string and
    ``chosen`` / ``rejected`` as the whole conversation, the user's turn included."""
    response = get_text_or_conversation(row, field)
    if is_conversation(response):
        asked = as_prompt(prompt) if prompt is not None else ()
        offset = len(asked) if len(response) > len(asked) and response[: len(asked)] == asked else 0  # type: ignore[index]
        response = response[offset:]  # type: ignore[index]
        require_response_start(row, field, response, offset)  # type: ignore[arg-type]
    return response


def pair(
    row: Row, f: Fields, prompt: TextOrConversation, chosen: TextOrConversation, rejected: TextOrConversation
) -> Example:
    """A preference example (with the margin when ``f.margin`` is set, a finite number: a NaN or infinite one
    makes the pair's loss non-finite, and the update it is in is skipped without naming it); a conversational
    pair must differ."""
    margin = get_finite_number(row, f.margin) if f.margin is not None else None
    example = conversational(Example(row.where, prompt, chosen=chosen, rejected=rejected, margin=margin))
    if is_conversation(example.prompt) and example.chosen == example.rejected:
        raise InvalidRecord(f"{row.where}: fields {f.chosen!r} and {f.rejected!r} are the same; a pair must differ")
    return example

"""Conversations in records: reading lists of chat messages, and the helpers the formats share.

A *message* is a JSON object with ``role`` one of :data:`ROLES` and ``content`` a non-empty string
(other keys, e.g. ``name`` or ``tool_calls``, are ignored). A :data:`Conversation` is a tuple of
``{"role", "content"}`` dicts, copies holding only those two keys, so two conversations compare
equal when their turns do.

Every check raises one :class:`~rlhf_lit.data.records.InvalidRecord` naming the record's place and
the field down to the message, e.g. ``data.jsonl line 3: field 'messages[2]' has role 'bot'; known
roles: system, user, assistant``.
"""

from __future__ import annotations

from typing import Any

from rlhf_lit.data.records import InvalidRecord, Row, get_list, get_text

ROLES = ("system", "user", "assistant")
"""The roles a message may have."""

Conversation = tuple[dict[str, str], ...]
"""Chat messages, each ``{"role": ..., "content": ...}``, in order."""

TextOrConversation = str | Conversation
"""A prompt or a response: plain text, or chat messages rendered by the tokenizer's chat template."""


def is_conversation(value: object) -> bool:
    """True for a :data:`Conversation` (the adapters build them as tuples; strings are text)."""
    return isinstance(value, tuple)


def from_json(value: Any) -> TextOrConversation:
    """A prompt or a response as a JSON file holds it (a conversation as a list) in this package's form (a tuple)."""
    return tuple(dict(m) for m in value) if isinstance(value, list) else value


def user_turn(text: str) -> Conversation:
    """A string prompt as a conversation: one user message."""
    return ({"role": "user", "content": text},)


def assistant_turn(text: str) -> Conversation:
    """A string response as a conversation: one assistant message."""
    return ({"role": "assistant", "content": text},)


def as_prompt(prompt: TextOrConversation) -> Conversation:
    """``prompt`` as messages (a string is one user message)."""
    return prompt if is_conversation(prompt) else user_turn(prompt)  # type: ignore[return-value, arg-type]


def as_response(response: TextOrConversation) -> Conversation:
    """``response`` as messages (a string is one assistant message)."""
    return response if is_conversation(response) else assistant_turn(response)  # type: ignore[return-value, arg-type]


def _message(row: Row, name: str, value: Any) -> dict[str, str]:
    """One validated message (a copy with ``role`` and ``content`` only); ``name`` is e.g. ``messages[2]``."""
    if not isinstance(value, dict):
        raise InvalidRecord(
            f"{row.where}: field '{name}' must be a message (an object with role and content), got {type(value).__name__}"
        )
    for key in ("role", "content"):
        if key not in value:
            keys = ", ".join(map(str, value)) or "none"
            raise InvalidRecord(f"{row.where}: field '{name}' has no {key!r} (message keys: {keys})")
    role, content = value["role"], value["content"]
    if role not in ROLES:
        raise InvalidRecord(f"{row.where}: field '{name}' has role {role!r}; known roles: {', '.join(ROLES)}")
    if not isinstance(content, str):
        raise InvalidRecord(f"{row.where}: field '{name}.content' must be a string, got {type(content).__name__}")
    if not content.strip():
        raise InvalidRecord(f"{row.where}: field '{name}.content' is empty")
    return {"role": role, "content": content}


def messages_of(row: Row, field: str, value: list) -> Conversation:
    """The list ``value`` (the record's ``field``) as a validated, non-empty conversation."""
    if not value:
        raise InvalidRecord(f"{row.where}: field {field!r} is empty")
    return tuple(_message(row, f"{field}[{i}]", m) for i, m in enumerate(value))


def get_conversation(row: Row, field: str) -> Conversation:
    """The conversation in ``row.data[field]``: present, a list, every message valid, not empty."""
    return messages_of(row, field, get_list(row, field, "messages"))


def text_or_conversation(row: Row, field: str, value: Any) -> TextOrConversation:
    """``value`` (the record's ``field``, or one item of it) as a non-empty string or a conversation.

    A list is read as a conversation when it holds a message object; a list of anything else (say
    strings) is neither, and the error says what a conversation is. Other values get the string
    field's own messages (missing, wrong type, empty).
    """
    if isinstance(value, list):
        if value and not any(isinstance(m, dict) for m in value):
            inner = type(value[0]).__name__
            raise InvalidRecord(
                f"{row.where}: field {field!r} must be a string, got list of {inner}; a conversation is a list "
                "of messages (objects with role and content)"
            )
        return messages_of(row, field, value)
    return get_text(Row(row.where, {field: value}), field)


def get_text_or_conversation(row: Row, field: str) -> TextOrConversation:
    """The string or the conversation in ``row.data[field]`` (see :func:`text_or_conversation`)."""
    if field not in row.data:
        return get_text(row, field)  # the missing-field message, with the record's keys
    return text_or_conversation(row, field, row.data[field])


def a_role(role: str) -> str:
    """The role with its article, for messages (``an assistant``, ``a user``)."""
    return "an assistant" if role == "assistant" else f"a {role}"


def require_prompt_end(row: Row, field: str, prompt: Conversation, offset: int = 0) -> None:
    """A conversational prompt must end with the user's turn: the model answers it next.

    ``offset`` is the index of ``prompt[0]`` in the record's field (for the message named)."""
    last = prompt[-1]["role"]
    if last != "user":
        raise InvalidRecord(
            f"{row.where}: field '{field}[{offset + len(prompt) - 1}]' ends the prompt on {a_role(last)} turn; "
            "a prompt must end with the user's turn"
        )


def require_response_start(row: Row, field: str, response: Conversation, offset: int = 0) -> None:
    """A conversational response must open with the assistant's message (it answers the prompt).

    ``offset`` is the index of ``response[0]`` in the record's field."""
    first = response[0]["role"]
    if first != "assistant":
        raise InvalidRecord(
            f"{row.where}: field '{field}[{offset}]' is a {first} turn; a response must start with the "
            "assistant's message"
        )


def shared_turns(a: Conversation, b: Conversation) -> int:
    """How many whole messages ``a`` and ``b`` share at their start."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def shared_words(a: str, b: str) -> int:
    """The length of the longest common prefix of ``a`` and ``b``, moved back to the start of its last
    whitespace so that no word is split between the prompt and a response and the responses start
    with the whitespace (0 when it has none). A prompt ending in a space would tokenize to a lone
    space token that the response, tokenized after it, repeats (sentencepiece: ``is▁`` + ``▁blue``)."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    while n > 0 and not a[n - 1].isspace():
        n -= 1
    while n > 0 and a[n - 1].isspace():
        n -= 1
    return n

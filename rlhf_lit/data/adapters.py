"""Format adapters: raw records -> text examples (prompt, response / chosen, rejected).

The ``format`` argument of the data modules picks one adapter here, in :func:`adapt` (the one
place a format is chosen). Each adapter reads one :class:`~rlhf_lit.data.records.Row` and returns
an :class:`Example`, raises :class:`Skip` for a record the format filters out on purpose (counted
and logged once per reason), or raises ``InvalidRecord`` for bad data (an error naming the file,
line and field, unless ``skip_invalid`` is set).

Formats (``"auto"``, the default of every data module, picks one of these from the first record
of each source: :mod:`rlhf_lit.data.detect`):

- ``"fields"``: generic records; column names from :class:`Fields`. ``prompt``, ``response``,
  ``chosen`` and ``rejected`` may each be a string or a conversation (a list of messages,
  :mod:`rlhf_lit.data.conversation`).
- ``"messages"``: ``{"messages": [...]}``, a whole conversation. SFT examples train its
  assistant turns (it must end on one); prompts are the conversation without its last assistant
  turn (what is left must end on a user turn). No preference examples.
- ``"prompt_completion"``: ``{"prompt", "completion"}``, strings or conversations (the completion
  then holds the assistant's message). SFT examples (loss on the completion) and prompts.
- ``"implicit_prompt"``: ``{"chosen", "rejected"}`` only, the prompt being what both share at
  their start: for conversations their longest shared run of whole messages (each rest must start
  with an assistant message); for strings their longest common prefix, moved back to the start of
  its last whitespace so that no word is split (the responses start with that whitespace, as TRL
  splits them). SFT examples are prompt + chosen.
- ``"text"``: language modelling: SFT examples train the whole ``text`` column (the prompt is
  empty: only the tokenizer's special prefix, e.g. BOS). No prompts (use ``paragraphs``).
- ``"hh_rlhf"``: Anthropic HH-RLHF transcripts ``{"chosen", "rejected"}``, each a full
  ``\\n\\nHuman: ... \\n\\nAssistant: ...`` dialogue, read by :mod:`rlhf_lit.data.hh`: as the
  conversation its turns spell (``AdapterOptions.hh_conversations``) or as strings split at the last
  ``\\n\\nAssistant:``. SFT examples are prompt + chosen and prompts are the prompt of the chosen
  transcript (the rejected transcript is not read for these).
- ``"alpaca"``: ``{"instruction", "input", "output"}``; when a record has a ``status`` field only
  ``status == "ok"`` is kept. The prompt is :data:`ALPACA_PROMPT` (or
  :data:`ALPACA_PROMPT_NO_INPUT` when ``input`` is missing, empty or ``"<noinput>"``), with the
  instruction and input stripped; the response is the stripped output.
- ``"paragraphs"``: plain text (``.txt`` paragraphs, or the ``text`` column): the prompt is the
  first ``prompt_words`` words (original spacing kept), the response the rest starting with the
  whitespace that follows. Paragraphs with at most ``prompt_words`` words are skipped and counted.
- ``"rankings"``: ``{"prompt", "responses": [best, ..., worst]}`` (column names from
  :class:`Fields`), K >= 2 distinct non-empty responses per record (strings or conversations;
  the prompt may be a conversation too), optionally with ties in a ``ranks`` column
  (:func:`read_ranking`). Preference examples carry every response and its rank;
  SFT examples are the prompt and the first best response; prompts are the prompt.

Conversations: a conversational prompt must end on the user's turn and a conversational response
start with the assistant's message. When any prompt or response of an example is a conversation,
its strings become messages too (a string prompt one user message, a string response one
assistant message), so that every response of a pair or a ranking follows one rendering of the
prompt. A conversational pair whose chosen and rejected are then equal is refused (string pairs
are read as they always were).
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from rlhf_lit.data.conversation import (
    Conversation,
    TextOrConversation,
    as_prompt,
    as_response,
    get_conversation,
    get_text_or_conversation,
    is_conversation,
    require_prompt_end,
    require_response_start,
    shared_turns,
    shared_words,
    text_or_conversation,
)
from rlhf_lit.data.example import Adapter, AdapterOptions, Example, Fields, Kind, Skip
from rlhf_lit.data.hh import hh_rlhf
from rlhf_lit.data.records import InvalidRecord, Row, get_list, get_number, get_text, missing_field

log = logging.getLogger("rlhf_lit.data")

AUTO = "auto"
ALPACA_PROMPT = "{instruction}\n\nInput:\n{input}\n\nResponse:\n"
ALPACA_PROMPT_NO_INPUT = "{instruction}\n\nResponse:\n"
ALPACA_NO_INPUT = {"", "<noinput>"}


def alpaca_prompt(instruction: str, input: str = "") -> str:
    """The alpaca prompt template (documented in the module docstring)."""
    instruction, input = instruction.strip(), input.strip()
    if input in ALPACA_NO_INPUT:
        return ALPACA_PROMPT_NO_INPUT.format(instruction=instruction)
    return ALPACA_PROMPT.format(instruction=instruction, input=input)


def alpaca(row: Row, kind: Kind, opt: AdapterOptions) -> Example:
    if "status" in row.data and row.data["status"] != "ok":
        raise Skip("status != 'ok'")
    prompt = alpaca_prompt(get_text(row, "instruction"), get_text(row, "input", required=False))
    if kind == "prompt":
        return Example(row.where, prompt)
    return Example(row.where, prompt, response=get_text(row, "output").strip())


_WORD = re.compile(r"\S+")


def paragraphs(row: Row, kind: Kind, opt: AdapterOptions) -> Example:
    text = get_text(row, opt.fields.text)
    words = list(_WORD.finditer(text))
    n = opt.prompt_words
    if len(words) <= n:
        raise Skip(f"at most prompt_words={n} words")
    cut = words[n - 1].end()
    if kind == "prompt":
        return Example(row.where, text[:cut])
    return Example(row.where, text[:cut], response=text[cut:])


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
        example, prompt=as_prompt(example.prompt), response=response(example.response),
        chosen=response(example.chosen), rejected=response(example.rejected),
        responses=None if example.responses is None else tuple(as_response(r) for r in example.responses),
    )  # fmt: skip


def _an(role: str) -> str:
    return "an assistant" if role == "assistant" else f"a {role}"


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


def _pair(row: Row, f: Fields, prompt: TextOrConversation, chosen: TextOrConversation, rejected: TextOrConversation
          ) -> Example:  # fmt: skip
    """A preference example (with the margin when ``f.margin`` is set); a conversational pair must differ."""
    margin = get_number(row, f.margin) if f.margin is not None else None
    example = conversational(Example(row.where, prompt, chosen=chosen, rejected=rejected, margin=margin))
    if is_conversation(example.prompt) and example.chosen == example.rejected:
        raise InvalidRecord(f"{row.where}: fields {f.chosen!r} and {f.rejected!r} are the same; a pair must differ")
    return example


def fields(row: Row, kind: Kind, opt: AdapterOptions) -> Example:
    f = opt.fields
    prompt = get_prompt(row, f.prompt)
    if kind == "prompt":
        return Example(row.where, prompt)
    if kind == "sft":
        return conversational(Example(row.where, prompt, response=get_response(row, f.response, prompt)))
    return _pair(row, f, prompt, get_response(row, f.chosen, prompt), get_response(row, f.rejected, prompt))


def messages(row: Row, kind: Kind, opt: AdapterOptions) -> Example:
    """A whole conversation: for SFT all of it (it must end on an assistant turn), as a prompt the
    conversation without its last assistant turn (which must leave a conversation ending on a user turn)."""
    name = opt.fields.messages
    conversation = get_conversation(row, name)
    last = conversation[-1]["role"]
    if kind == "sft":
        if last != "assistant":
            raise InvalidRecord(
                f"{row.where}: field '{name}[{len(conversation) - 1}]' ends the conversation on {_an(last)} turn; SFT "
                "needs a conversation that ends with the assistant's response"
            )
        first = next(i for i, m in enumerate(conversation) if m["role"] == "assistant")
        return Example(row.where, conversation[:first], messages=conversation)
    prompt = conversation[:-1] if last == "assistant" else conversation
    if not prompt:
        raise InvalidRecord(f"{row.where}: field {name!r} holds only an assistant turn; a prompt needs the user's turn")
    require_prompt_end(row, name, prompt)
    return Example(row.where, prompt)


def prompt_completion(row: Row, kind: Kind, opt: AdapterOptions) -> Example:
    f = opt.fields
    prompt = get_prompt(row, f.prompt)
    if kind == "prompt":
        return Example(row.where, prompt)
    return conversational(Example(row.where, prompt, response=get_response(row, f.completion)))


def _implicit_conversations(row: Row, f: Fields, chosen: Conversation, rejected: Conversation
                            ) -> tuple[Conversation, Conversation, Conversation]:  # fmt: skip
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
    return _pair(row, f, prompt, chosen, rejected)


def text(row: Row, kind: Kind, opt: AdapterOptions) -> Example:
    """Language modelling: the whole text is the response; the prompt is empty (only the specials)."""
    return Example(row.where, "", response=get_text(row, opt.fields.text))


def _ranks(row: Row, field: str, k: int) -> list[int]:
    """The ``ranks`` column of a ranking record as dense ranks (0 = best); see :func:`read_ranking`."""
    if field not in row.data:
        raise missing_field(row, field)
    value = row.data[field]
    if not isinstance(value, list) or len(value) != k:
        got = f"{len(value)} values" if isinstance(value, list) else type(value).__name__
        raise InvalidRecord(f"{row.where}: field {field!r} must be a list of {k} ints (one per response), got {got}")
    for i, r in enumerate(value):
        if isinstance(r, bool) or not isinstance(r, int):
            raise InvalidRecord(f"{row.where}: field '{field}[{i}]' must be an int, got {type(r).__name__}")
    for i in range(1, k):
        if value[i] < value[i - 1]:
            raise InvalidRecord(
                f"{row.where}: field '{field}[{i}]' is {value[i]}, below '{field}[{i - 1}]' ({value[i - 1]}): "
                "responses are listed best first and a lower rank is better, so ranks never decrease"
            )
    dense = {r: d for d, r in enumerate(sorted(set(value)))}
    return [dense[r] for r in value]


def read_ranking(row: Row, f: Fields) -> tuple[list[TextOrConversation], list[int]]:
    """The responses (best first) and their dense ranks (0 = best) of a ranking record.

    ``responses`` must be a list of at least 2 distinct, non-empty strings or conversations (each
    opening on the assistant's message; a string and a conversation of one assistant message with
    the same text are the same response). With ``f.ranks`` set, the ``ranks`` column must be a
    list of as many ints, never decreasing along the list (lower = better, equal = tie; any ints,
    renumbered 0, 1, ...); without it the i-th response has rank i. Raises ``InvalidRecord`` naming
    the place and field (e.g. ``responses[2]``); a record whose responses all tie has no pair to
    learn from and is skipped (counted).
    """
    name = f.responses
    values = get_list(row, name, "strings")
    if len(values) < 2:
        raise InvalidRecord(f"{row.where}: field {name!r} must hold at least 2 responses, got {len(values)}")
    responses = []
    for i, value in enumerate(values):
        response = text_or_conversation(row, f"{name}[{i}]", value)
        if is_conversation(response):
            require_response_start(row, f"{name}[{i}]", response)  # type: ignore[arg-type]
        responses.append(response)
    chat = any(is_conversation(r) for r in responses)
    first: dict[Any, int] = {}
    for i, response in enumerate(responses):
        key = tuple((m["role"], m["content"]) for m in as_response(response)) if chat else response
        if key in first:
            raise InvalidRecord(
                f"{row.where}: field '{name}[{i}]' repeats '{name}[{first[key]}]' (responses must differ)"
            )
        first[key] = i
    ranks = _ranks(row, f.ranks, len(responses)) if f.ranks is not None else list(range(len(responses)))
    if max(ranks) == 0:
        raise Skip("all responses tie (no pair to learn from)")
    return responses, ranks


def rankings(row: Row, kind: Kind, opt: AdapterOptions) -> Example:
    """A ranking record as a preference example (every response and its rank), an SFT example (the
    prompt and the first response, a best one) or a prompt (the responses are not read)."""
    prompt = get_prompt(row, opt.fields.prompt)
    if kind == "prompt":
        return Example(row.where, prompt)
    responses, ranks = read_ranking(row, opt.fields)
    if kind == "sft":  # ranks never decrease: the first is a best
        return conversational(Example(row.where, prompt, response=responses[0]))
    return conversational(Example(row.where, prompt, responses=tuple(responses), ranks=tuple(ranks)))


ADAPTERS: dict[str, tuple[Adapter, tuple[str, ...]]] = {
    "fields": (fields, ("sft", "preference", "prompt")),
    "hh_rlhf": (hh_rlhf, ("sft", "preference", "prompt")),
    "alpaca": (alpaca, ("sft", "prompt")),
    "paragraphs": (paragraphs, ("sft", "prompt")),
    "rankings": (rankings, ("sft", "preference", "prompt")),
    "messages": (messages, ("sft", "prompt")),
    "prompt_completion": (prompt_completion, ("sft", "prompt")),
    "implicit_prompt": (implicit_prompt, ("sft", "preference", "prompt")),
    "text": (text, ("sft",)),
}
"""Every record format: its adapter and the kinds of examples it gives. The one list: the data
modules' ``format`` options take their choices from it (:data:`Format`, :data:`SFTFormat`, ...)."""


def formats_for(kind: Kind | None = None) -> tuple[str, ...]:
    """``auto`` and the formats of :data:`ADAPTERS` that give ``kind`` examples (every one for None),
    in registry order: the choices of a data module's format option."""
    return (AUTO, *(name for name, (_, kinds) in ADAPTERS.items() if kind is None or kind in kinds))


# A Literal of a tuple is the Literal of its items: each option's choices are read off the registry
# (jsonargparse checks values and lists choices from these), never written out again.
Format = Literal[formats_for()]  # type: ignore[valid-type]
"""The record formats known to the data modules; ``auto`` detects one from a source's first record."""
SFTFormat = Literal[formats_for("sft")]  # type: ignore[valid-type]
"""The formats with SFT examples (``SFTDataModule.format``, ``ptx_format``, ``reference_format``)."""
PreferenceFormat = Literal[formats_for("preference")]  # type: ignore[valid-type]
"""The formats with preference examples (``PreferenceDataModule.format``)."""
PromptFormat = Literal[formats_for("prompt")]  # type: ignore[valid-type]
"""The formats with prompts (``PromptDataModule.format``)."""


def check_format(format: str, kind: Kind) -> None:
    """Raise a clear error for an unknown format or one that cannot give ``kind`` examples
    (``auto`` is checked once it has picked a format, on the data)."""
    if format == AUTO:
        return
    if format not in ADAPTERS:
        raise ValueError(f"unknown format {format!r}; choose one of {AUTO}, {', '.join(ADAPTERS)}")
    if kind not in ADAPTERS[format][1]:
        supported = [f for f, (_, kinds) in ADAPTERS.items() if kind in kinds]
        raise ValueError(
            f"format {format!r} has no {kind} examples; for {kind} data use one of "
            f"{', '.join(supported)}"
        )


def check_fields(format: str, fields: Fields) -> None:
    """Refuse columns the format cannot use: a margin for rankings, ranks for anything else
    (``auto`` is checked once it has picked a format)."""
    if format == AUTO:
        return
    if format == "rankings" and fields.margin is not None:
        raise ValueError(
            f"fields.margin is set ({fields.margin!r}) but format 'rankings' has no margin: a ranking only "
            "orders its responses (ties through fields.ranks); unset fields.margin"
        )
    if format != "rankings" and fields.ranks is not None:
        raise ValueError(
            f"fields.ranks is set ({fields.ranks!r}) but only format 'rankings' reads it (format is {format!r})"
        )


@dataclass
class Adapted:
    """The examples of one source and what was left out, by reason."""

    examples: list[Example]
    skipped: Counter[str]
    invalid: int = 0


def adapt(
    rows: Sequence[Row],
    *,
    format: Format,
    kind: Kind,
    options: AdapterOptions,
    skip_invalid: bool = False,
    source: str = "",
) -> Adapted:
    """Turn rows into examples with the adapter of ``format``; log skip counts once per reason.
    ``format`` is a resolved one (:func:`rlhf_lit.data.detect.resolve_format` picks it for ``auto``)."""
    if format == AUTO:
        raise ValueError("adapt() needs a resolved format: resolve 'auto' with rlhf_lit.data.detect.resolve_format")
    check_format(format, kind)
    adapter = ADAPTERS[format][0]
    out = Adapted([], Counter())
    first_invalid = ""
    for row in rows:
        try:
            example = adapter(row, kind, options)
            if options.extra_fields:
                missing = [name for name in options.extra_fields if name not in row.data]
                if missing:
                    raise InvalidRecord(f"{row.where}: missing extra field(s) {missing} (extra_fields)")
                example = replace(example, extras={name: row.data[name] for name in options.extra_fields})
            out.examples.append(example)
        except Skip as s:
            out.skipped[str(s)] += 1
        except InvalidRecord as e:
            if not skip_invalid:
                raise
            out.invalid += 1
            first_invalid = first_invalid or str(e)
    for reason, count in out.skipped.items():
        log.info("%s: skipped %d of %d records (%s)", source, count, len(rows), reason)
    if out.invalid:
        log.info(
            "%s: skipped %d of %d invalid records (skip_invalid=True); first: %s",
            source, out.invalid, len(rows), first_invalid,
        )
    return out

"""Format adapters: raw records -> text examples (prompt, response / chosen, rejected).

This module holds the registry (:data:`ADAPTERS`), the small adapters and :func:`adapt`; the parts
every adapter reads a record with are in :mod:`rlhf_lit.data.record_parts`, and the two larger
formats in their own modules, :mod:`rlhf_lit.data.implicit_prompt` and :mod:`rlhf_lit.data.rankings`
(HH-RLHF transcripts: :mod:`rlhf_lit.data.hh`); every adapter, and what an adapter takes and gives
(:mod:`rlhf_lit.data.example`), is importable from here too.

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
from dataclasses import dataclass, field, replace
from typing import Literal

from rlhf_lit.data.conversation import a_role, get_conversation, require_prompt_end
from rlhf_lit.data.example import Adapter, AdapterOptions, Example, Fields, Kind, Skip
from rlhf_lit.data.hh import hh_rlhf
from rlhf_lit.data.implicit_prompt import implicit_prompt
from rlhf_lit.data.rankings import rankings
from rlhf_lit.data.record_parts import conversational, get_prompt, get_response, pair
from rlhf_lit.data.records import InvalidRecord, Row, get_text

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


def fields(row: Row, kind: Kind, opt: AdapterOptions) -> Example:
    f = opt.fields
    prompt = get_prompt(row, f.prompt)
    if kind == "prompt":
        return Example(row.where, prompt)
    if kind == "sft":
        return conversational(Example(row.where, prompt, response=get_response(row, f.response, prompt)))
    return pair(row, f, prompt, get_response(row, f.chosen, prompt), get_response(row, f.rejected, prompt))


def messages(row: Row, kind: Kind, opt: AdapterOptions) -> Example:
    """A whole conversation: for SFT all of it (it must end on an assistant turn), as a prompt the
    conversation without its last assistant turn (which must leave a conversation ending on a user turn)."""
    name = opt.fields.messages
    conversation = get_conversation(row, name)
    last = conversation[-1]["role"]
    if kind == "sft":
        if last != "assistant":
            raise InvalidRecord(
                f"{row.where}: field '{name}[{len(conversation) - 1}]' ends the conversation on {a_role(last)} turn; SFT "
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


def text(row: Row, kind: Kind, opt: AdapterOptions) -> Example:
    """Language modelling: the whole text is the response; the prompt is empty (only the specials)."""
    return Example(row.where, "", response=get_text(row, opt.fields.text))


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
        raise ValueError(f"format {format!r} has no {kind} examples; for {kind} data use one of {', '.join(supported)}")


def check_extra_fields(extra_fields: list[str] | None) -> list[str]:
    """A data module's ``extra_fields`` as a list; a repeated name refused, naming the option."""
    names = list(extra_fields or [])
    if len(set(names)) != len(names):
        raise ValueError(f"extra_fields must not repeat a name, got {names}")
    return names


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
    positions: list[int] = field(default_factory=list)
    """Each example's record: its position among the rows adapted (0-based, the rows left out counted), so
    that a split by record position holds out the same records whatever a format leaves out."""


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
    for position, row in enumerate(rows):
        try:
            example = adapter(row, kind, options)
            if options.extra_fields:
                missing = [name for name in options.extra_fields if name not in row.data]
                if missing:
                    raise InvalidRecord(f"{row.where}: missing extra field(s) {missing} (extra_fields)")
                example = replace(example, extras={name: row.data[name] for name in options.extra_fields})
            out.examples.append(example)
            out.positions.append(position)
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
            source,
            out.invalid,
            len(rows),
            first_invalid,
        )
    return out

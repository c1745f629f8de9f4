"""What a format adapter takes and gives: the column names (:class:`Fields`), the options
(:class:`AdapterOptions`), the :class:`Example` it returns and the :class:`Skip` it raises.

Apart from :mod:`rlhf_lit.data.adapters` (which picks an adapter per format) so that an adapter
kept in a module of its own (:mod:`rlhf_lit.data.hh`) can use these without importing the registry
that imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from rlhf_lit.data.conversation import Conversation, TextOrConversation
from rlhf_lit.data.records import Row

Kind = Literal["sft", "preference", "prompt"]
"""The shape of example a data module needs."""


@dataclass(frozen=True)
class Fields:
    """Column names of the records, read by the formats of the registry
    :data:`rlhf_lit.data.adapters.ADAPTERS` (which format reads which column: the arguments below
    and :mod:`rlhf_lit.data.adapters`; ``alpaca`` keeps its own fixed names). Format ``auto`` looks
    for these names in the first record.

    Args:
        prompt: column holding the prompt.
        response: column holding the demonstration (SFT).
        chosen: column holding the preferred response (the full transcript for ``hh_rlhf``).
        rejected: column holding the dispreferred response (the full transcript for
            ``hh_rlhf``).
        margin: optional column holding a numeric preference margin; when set, every record
            must have it and preference batches carry ``margin``.
        text: column holding plain text for the ``paragraphs`` format (``.txt`` files give it).
        responses: column holding the ranked responses, best first (``rankings`` format).
        ranks: optional column holding one int per response, lower = better, equal = tie
            (``rankings`` format); None: every response has its own rank, in list order.
        completion: column holding the completion (``prompt_completion`` format).
        messages: column holding a whole conversation (``messages`` format).
    """

    prompt: str = "prompt"
    response: str = "response"
    chosen: str = "chosen"
    rejected: str = "rejected"
    margin: str | None = None
    text: str = "text"
    responses: str = "responses"
    ranks: str | None = None
    completion: str = "completion"
    messages: str = "messages"


@dataclass(frozen=True)
class Example:
    """One example. SFT sets ``response``, or ``messages`` for a whole conversation whose assistant
    turns are trained (then ``prompt`` is its turns before the first assistant message); preference
    pairs set ``chosen``, ``rejected`` (and ``margin`` when the data has one), rankings
    ``responses`` (best first) and their ``ranks`` (0 = best, dense, equal = tie); prompts set
    ``prompt`` only. Prompts and responses are strings, or conversations rendered by the
    tokenizer's chat template (all of an example's, or none: see the module docstring)."""

    where: str
    prompt: TextOrConversation
    response: TextOrConversation | None = None
    chosen: TextOrConversation | None = None
    rejected: TextOrConversation | None = None
    margin: float | None = None
    responses: tuple[TextOrConversation, ...] | None = None
    ranks: tuple[int, ...] | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    messages: Conversation | None = None


class Skip(Exception):
    """A record filtered out on purpose by its format; the message is the reason (counted)."""


@dataclass(frozen=True)
class AdapterOptions:
    """What an adapter may need besides the row."""

    fields: Fields
    prompt_words: int
    extra_fields: tuple[str, ...] = ()
    """Columns copied unchanged into ``Example.extras`` (e.g. ``ground_truth`` for a reward function)."""
    hh_conversations: bool = False
    """Read ``hh_rlhf`` transcripts as conversations (the data module's ``hh_render`` resolved to
    chat: :mod:`rlhf_lit.data.rendering`); False keeps them as the strings they are."""


Adapter = Callable[[Row, Kind, AdapterOptions], Example]

"""Format ``auto``: the record format of a source, told from the keys of its first record.

The rules, first match wins (the column names are those of :class:`~rlhf_lit.data.adapters.Fields`,
by default the names shown):

============================================  ====================  ======================
first record has                              format                examples it gives
============================================  ====================  ======================
``messages`` (for pairs: without ``chosen``   ``messages``          SFT, prompts
+ ``rejected``)
``chosen`` + ``rejected`` + ``prompt``        ``fields``            preference, prompts
``chosen`` + ``rejected``, chosen a string    ``hh_rlhf``           preference, prompts
starting ``\\n\\nHuman:`` or holding
``\\n\\nAssistant:``
``chosen`` + ``rejected``, otherwise          ``implicit_prompt``   preference, prompts
``responses``                                 ``rankings``          preference, prompts
``prompt`` + ``completion``                   ``prompt_completion`` SFT, prompts
``prompt`` + ``response``                     ``fields``            SFT, prompts
``instruction`` + ``output``                  ``alpaca``            SFT, prompts
``text``                                      ``text`` (SFT),       SFT, prompts
                                              ``paragraphs``
                                              (prompts)
``prompt``                                    ``fields``            prompts
============================================  ====================  ======================

A record with both pairs and ``responses`` is read as pairs (``fields`` was the default before
``auto``). A plain-text source (``.txt``) is read as ``paragraphs``. Pairs and rankings give no SFT examples
under ``auto`` (as TRL's SFT reads none): set ``format`` to train on their prompt and chosen
response. One INFO line names the source, the format picked and the keys seen; a record that
matches no rule, or matches one that gives no examples of the kind needed, is one ``ValueError``
naming the source, the record and its keys.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from rlhf_lit.data.adapters import ADAPTERS, AUTO, Fields, Kind
from rlhf_lit.data.hh import HH_ASSISTANT, HH_HUMAN
from rlhf_lit.data.records import Row

log = logging.getLogger("rlhf_lit.data")

PAIR_KINDS: tuple[Kind, ...] = ("preference", "prompt")
SFT_KINDS: tuple[Kind, ...] = ("sft", "prompt")


def _match(data: dict, f: Fields, kind: Kind) -> tuple[str, tuple[Kind, ...]] | None:
    """(format, the kinds ``auto`` reads it as) for the keys of ``data``; None when no rule matches."""
    has = data.__contains__
    # A pair set may carry a messages column too (HuggingFaceH4/ultrafeedback_binarized): pairs, for pairs.
    if has(f.messages) and not (kind == "preference" and has(f.chosen) and has(f.rejected)):
        return "messages", SFT_KINDS
    if has(f.chosen) and has(f.rejected):  # before responses: pairs were the default before auto
        if has(f.prompt):
            return "fields", PAIR_KINDS
        chosen = data[f.chosen]
        hh = isinstance(chosen, str) and (chosen.startswith(HH_HUMAN) or HH_ASSISTANT in chosen)
        return ("hh_rlhf" if hh else "implicit_prompt"), PAIR_KINDS
    if has(f.responses):
        return "rankings", PAIR_KINDS
    if has(f.prompt) and has(f.completion):
        return "prompt_completion", SFT_KINDS
    if has(f.prompt) and has(f.response):
        return "fields", SFT_KINDS
    if has("instruction") and has("output"):
        return "alpaca", SFT_KINDS
    if has(f.text):
        return ("paragraphs" if kind == "prompt" else "text"), SFT_KINDS
    if has(f.prompt):
        return "fields", ("prompt",)
    return None


def _hint(format: str, kinds: tuple[Kind, ...], kind: Kind, f: Fields, readers: str) -> str:
    """What to do about a record that ``auto`` reads as no ``kind`` examples: pairs and rankings
    give SFT examples when their format is set; other shapes need other data."""
    if kind == "sft" and kinds == PAIR_KINDS:
        if format == "fields":
            return f"set format: fields and fields.response: {f.chosen} to train on the chosen responses"
        return f"set format: {format} to train on the prompt and the chosen (best) response"
    return f"{kind} data needs one of the formats {readers}"


def detect_format(row: Row, kind: Kind, fields: Fields, source: str) -> str:
    """The format of the record ``row`` (a source's first) for ``kind`` examples; see the module docstring."""
    keys = ", ".join(map(str, row.data)) or "none"
    match = _match(row.data, fields, kind)
    readers = ", ".join(name for name, (_, kinds) in ADAPTERS.items() if kind in kinds)
    if match is None:
        raise ValueError(
            f"{source} record 1 ({row.where}): cannot tell the record format from its keys ({keys}); "
            f"set format: one of {readers}"
        )
    format, kinds = match
    if kind not in kinds:
        raise ValueError(
            f"{source} record 1 ({row.where}): looks like {format} (keys {keys}), which has no {kind} examples "
            f"under format auto; {_hint(format, kinds, kind, fields, readers)}"
        )
    log.info("%s: format auto read as %s (record 1 keys: %s)", source, format, keys)
    return format


def resolve_format(
    format: str, rows: Sequence[Row], *, kind: Kind, fields: Fields, source: str, text_file: bool
) -> str:
    """``format`` itself, or for ``auto`` the format of ``rows`` (``paragraphs`` for a plain-text
    source, ``text_file``); ``auto`` over no rows stays ``auto`` (the caller reports the empty source)."""
    if format != AUTO:
        return format
    if text_file:
        log.info("%s: format auto read as paragraphs (plain text)", source)
        return "paragraphs"
    return detect_format(rows[0], kind, fields, source) if rows else AUTO

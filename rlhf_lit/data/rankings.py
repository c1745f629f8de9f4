"""Format ``rankings``: ``{"prompt", "responses": [best, ..., worst]}``, optionally with ties in a
``ranks`` column (:func:`read_ranking`): K >= 2 distinct responses per record, read as a preference
example carrying every response and its dense rank, an SFT example (the first, a best response) or a
prompt.

The one writer of such records (``rlhf-lit iterate``'s labels, the offline demo's): :func:`distinct_responses`
(which samples a ranking keeps), :func:`order_by_scores` / :func:`dense_ranks` (best first, equal scores tied)
and :func:`ranking_record` (the record, its ranks in :data:`RANKS_FIELD`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlhf_lit.data.conversation import (
    TextOrConversation,
    as_response,
    is_conversation,
    require_response_start,
    text_or_conversation,
)
from rlhf_lit.data.example import AdapterOptions, Example, Fields, Kind, Skip
from rlhf_lit.data.record_parts import conversational, get_prompt
from rlhf_lit.data.records import InvalidRecord, Row, get_list

RANKS_FIELD = "ranks"
"""The column :func:`ranking_record` writes the ranks to (read with ``fields: {ranks: ranks}``)."""


def distinct_responses(responses: Sequence[str]) -> list[int]:
    """The indices of the responses a ranking keeps: the non-blank ones, each text at its first place (a repeat
    adds no comparison, and :func:`read_ranking` refuses it)."""
    kept, seen = [], set()
    for i, response in enumerate(responses):
        if response.strip() and response not in seen:
            kept.append(i)
            seen.add(response)
    return kept


def dense_ranks(scores: Sequence[float]) -> list[int]:
    """Dense ranks of ``scores`` sorted best first: 0 for the highest, +1 at each lower score, equal scores
    sharing a rank (a tie: no pair between them). ``[0.9, 0.5, 0.5, 0.1] -> [0, 1, 1, 2]``."""
    ranks: list[int] = []
    for n, score in enumerate(scores):
        if n > 0 and score > scores[n - 1]:
            raise ValueError(f"scores must be sorted best first, got {list(scores)}")
        ranks.append(0 if n == 0 else ranks[-1] + (score < scores[n - 1]))
    return ranks


def order_by_scores(scores: Sequence[float]) -> tuple[list[int], list[int]]:
    """``(order, ranks)``: the indices by score, highest first (equal scores keep their order and tie), and
    their :func:`dense_ranks`."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])  # sorted is stable
    return order, dense_ranks([scores[i] for i in order])


def ranking_record(
    prompt: Any, responses: Sequence[Any], order: Sequence[int], ranks: Sequence[int], scores: Sequence[float] | None
) -> dict:
    """The ``rankings`` record of ``prompt``'s ``responses`` taken in ``order`` (best first) with their ``ranks``
    (never decreasing, equal = tie): ``{"prompt", "responses", "ranks"}``, and ``"scores"`` in the same order
    when given."""
    record = {"prompt": prompt, "responses": [responses[i] for i in order], RANKS_FIELD: list(ranks)}
    if scores is not None:
        record["scores"] = [float(scores[i]) for i in order]
    return record


def ranked_pairs(ranks: Sequence[int]) -> list[tuple[int, int]]:
    """The (better, worse) index pairs a ranking's ``ranks`` hold; tied responses make none."""
    return [(i, j) for i, a in enumerate(ranks) for j, b in enumerate(ranks) if a < b]


def count_ranked_pairs(ranks: Sequence[int]) -> int:
    """How many :func:`ranked_pairs` a ranking's ``ranks`` hold."""
    return len(ranked_pairs(ranks))


def _ranks(row: Row, field: str, k: int) -> list[int]:
    """The ``ranks`` column of a ranking record as dense ranks (0 = best); see :func:`read_ranking`."""
    value = get_list(row, field, f"{k} ints (one per response)")
    if len(value) != k:
        raise InvalidRecord(
            f"{row.where}: field {field!r} must be a list of {k} ints (one per response), got {len(value)} values"
        )
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

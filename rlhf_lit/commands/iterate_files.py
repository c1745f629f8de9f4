"""The fields of the files ``rlhf-lit iterate`` reads back from its run directory, checked where they are read.

A file cut short, empty or not JSON is redone (:func:`rlhf_lit.commands.iterate_steps.intact`: a kill or a full
disk left it so). A file that parses but whose fields are not what the loop wrote was damaged otherwise or edited
by hand; the loop would train on it as it is (a string where a list of records was kept is read as one record per
character) or stop with a ``KeyError`` traceback, so it is refused, one line naming the file and the field, before
anything is trained or written on it. Each reader is built on the data package's record checks
(:mod:`rlhf_lit.data.records`, :func:`rlhf_lit.data.rankings.read_ranking`), so its errors read as a data file's.

- ``samples.jsonl``: per prompt ``prompt`` (a string or a conversation) and ``responses`` (K strings);
- ``labels.json``: ``train`` and ``held_out``, lists of ranking records (``prompt``, ``responses``, ``ranks``);
  ``sample_scores``, null or one list of finite numbers per prompt;
- ``baseline.json`` and ``metrics.json``: ``row``, a summary row (:data:`ROW_FIELDS`);
- ``iterate.json``: read by :func:`rlhf_lit.commands.iterate_command.read_snapshot`, its fields by
  :func:`check_snapshot_fields`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rlhf_lit.data.records import InvalidRecord, Row, get_finite_number, get_int, get_list, missing_field

SAMPLE_SCORES_KEY = "sample_scores"
"""``labels.json``'s labeller scores of every sample, per prompt in ``samples.jsonl``'s order (a scoring labeller)."""
REDO_HINT = "rlhf-lit iterate wrote it: delete it to have it written again"
"""What the refusal of a damaged run file suggests (every such file is a step's output, redone when missing)."""
ROW_FIELDS: dict[str, str] = {
    "iteration": "count",
    "labelled_prompts": "count",
    "labelled_pairs": "count",
    "rm_train_records": "count",
    "held_out_pairs": "count",
    "rm_acc_before": "number",
    "rm_acc_after": "number",
    "gold": "number",
    "proxy": "number",
    "kl": "number",
    "length": "number",
    "ppo_proxy": "number",
    "ppo_judge": "number",
    "ppo_kl": "number",
    "guard_fired": "text",
}
"""The summary's columns, one row per iteration (0: the SFT model), each with its kind: ``count`` (an int >= 0),
``number`` (finite) or ``text``; any of them null where not measured."""


def refusing(path: str, check: Callable[[], Any]) -> Any:
    """What ``check`` returns; a record error it raises becomes one ``ValueError`` that says the file is the
    loop's own and how to have it written again (``path``: the file, named by the error already)."""
    try:
        return check()
    except InvalidRecord as error:
        raise ValueError(f"{error}; {REDO_HINT}") from None


def _mapping(where: str, data: dict, field: str) -> dict:
    """The JSON object in ``data[field]``."""
    if field not in data:
        raise missing_field(Row(where, data), field)
    if not isinstance(data[field], dict):
        raise InvalidRecord(f"{where}: field {field!r} must be a JSON object, got {type(data[field]).__name__}")
    return data[field]


def _record(where: str, value: Any) -> Row:
    """``value`` as a record at ``where``: a JSON object."""
    if not isinstance(value, dict):
        raise InvalidRecord(f"{where}: must be a JSON object, got {type(value).__name__}")
    return Row(where, value)


def checked_row(path: str, kept: dict, t: int) -> dict:
    """The summary row of iteration ``t`` kept in ``baseline.json`` (t = 0) or ``metrics.json`` (``kept``: the
    file's object): ``row`` an object whose ``iteration`` is ``t`` and whose other columns are each of their
    kind (:data:`ROW_FIELDS`) or null. A column missing from it reads as not measured (``-``), as in a row
    written before the column was added."""

    def check() -> dict:
        row = Row(f"{path} row", _mapping(path, kept, "row"))
        if get_int(row, "iteration") != t:
            raise InvalidRecord(f"{row.where}: field 'iteration' is {row.data['iteration']} in iteration {t}'s file")
        for field, kind in ROW_FIELDS.items():
            if field not in row.data:
                continue
            if kind == "count":
                get_int(row, field, nullable=True)
            elif kind == "number":
                get_finite_number(row, field, nullable=True)
            elif not (row.data[field] is None or isinstance(row.data[field], str)):
                got = type(row.data[field]).__name__
                raise InvalidRecord(f"{row.where}: field {field!r} must be a string or null, got {got}")
        return row.data

    return refusing(path, check)


def _ranking(where: str, value: Any) -> None:
    """Refuse a label that is not a ranking record as the reward model's data module reads it."""
    from rlhf_lit.data.example import Fields, Skip
    from rlhf_lit.data.rankings import RANKS_FIELD, read_ranking
    from rlhf_lit.data.record_parts import get_prompt

    row = _record(where, value)
    get_prompt(row, "prompt")
    try:
        read_ranking(row, Fields(ranks=RANKS_FIELD))
    except Skip:
        pass  # every response tied: the data module skips it, and it holds no pair to count


def checked_labels(path: str, kept: dict) -> tuple[list, list]:
    """``(train, held_out)`` of ``labels.json`` (``kept``: its object), each a list of ranking records, and its
    ``sample_scores`` null or a list of lists of finite numbers (:func:`checked_sample_scores` matches them with
    the samples)."""

    def check() -> tuple[list, list]:
        top = Row(path, kept)
        parts = []
        for field in ("train", "held_out"):
            records = get_list(top, field, "ranking records")
            for i, record in enumerate(records):
                _ranking(f"{path} {field}[{i}]", record)
            parts.append(records)
        if kept.get(SAMPLE_SCORES_KEY) is not None:
            for i, scores in enumerate(get_list(top, SAMPLE_SCORES_KEY, "lists of numbers")):
                field = f"{SAMPLE_SCORES_KEY}[{i}]"
                for j, score in enumerate(get_list(Row(path, {field: scores}), field, "numbers")):
                    get_finite_number(Row(path, {f"{field}[{j}]": score}), f"{field}[{j}]")
        return parts[0], parts[1]

    return refusing(path, check)


def checked_sample_scores(path: str, kept: dict, samples: Sequence[dict]) -> list[list[float]]:
    """``labels.json``'s ``sample_scores`` (``kept``: its object, checked by :func:`checked_labels`): one score
    per sample of each prompt of ``samples``.

    Raises:
        ValueError: there are none (labels from a file) or not one per sample.
    """
    scores = kept.get(SAMPLE_SCORES_KEY)
    if scores is None or len(scores) != len(samples):
        raise ValueError(f"{path} holds no labeller score of every sample")
    for i, (mine, sample) in enumerate(zip(scores, samples)):
        if len(mine) != len(sample["responses"]):
            raise ValueError(
                f"{path}: field '{SAMPLE_SCORES_KEY}[{i}]' holds {len(mine)} scores for the {len(sample['responses'])} "
                f"samples of prompt {i}; {REDO_HINT}"
            )
    return scores


def checked_samples(path: str, records: list, k: int) -> list[dict]:
    """``samples.jsonl``'s records (``records``: its lines), each a JSON object with a ``prompt`` (a string or a
    conversation) and ``k`` ``responses``, each a string (an empty one too: a policy may sample it)."""
    from rlhf_lit.data.record_parts import get_prompt

    def check() -> list[dict]:
        for line, record in enumerate(records, start=1):
            row = _record(f"{path} line {line}", record)
            get_prompt(row, "prompt")
            responses = get_list(row, "responses", "strings")
            if len(responses) != k:
                raise InvalidRecord(
                    f"{row.where}: field 'responses' holds {len(responses)} responses, not {k} (responses_per_prompt)"
                )
            for i, response in enumerate(responses):
                if not isinstance(response, str):
                    got = type(response).__name__
                    raise InvalidRecord(f"{row.where}: field 'responses[{i}]' must be a string, got {got}")
        return records

    return refusing(path, check)


def check_snapshot_fields(path: str, kept: dict, chat_key: str) -> None:
    """Refuse an ``iterate.json`` (``kept``: its object, its ``config`` an object) whose ``config.prompts`` is not
    an object or whose ``chat_key`` is not a bool: a rerun compares them with its own config and rendering."""
    config = Row(f"{path} config", kept["config"])
    if "prompts" in config.data and not isinstance(config.data["prompts"], dict):
        raise InvalidRecord(
            f"{config.where}: field 'prompts' must be a JSON object, got {type(config.data['prompts']).__name__}"
        )
    if chat_key in kept and not isinstance(kept[chat_key], bool):
        raise InvalidRecord(f"{path}: field {chat_key!r} must be true or false, got {type(kept[chat_key]).__name__}")

"""Reading sources into examples: one source (:func:`read_examples`: records read, their format resolved, each
adapted) and where a data module's validation examples come from (:func:`validation_source`).

The one path from a file or a hub dataset to examples: the data modules
(:meth:`~rlhf_lit.data.base.TextDataModule.read_splits`) and the prompt sources of the commands and
callbacks (:mod:`rlhf_lit.data.prompt_source`) both read through it.
"""

from __future__ import annotations

from typing import NamedTuple

from rlhf_lit.data.adapters import AUTO, AdapterOptions, Example, Fields, Kind, adapt, check_fields, check_format
from rlhf_lit.data.detect import resolve_format
from rlhf_lit.data.records import FileReading, is_local_source, is_text_file, read_rows


class SourceExamples(NamedTuple):
    """The examples of one source, the format they were read in, and which record each came from."""

    examples: list[Example]
    format: str
    """The format the source was read in (``auto`` resolved)."""
    records: int
    """The records read (at most ``max_records``), those the format left out included."""
    positions: list[int]
    """Each example's record: its position among the ``records`` (0-based), what a seeded split draws by
    (:func:`~rlhf_lit.data.splits.split_by_fraction`)."""


def read_examples(
    source: str,
    *,
    format: str,
    kind: Kind,
    fields: Fields,
    split: str = "train",
    subset: str | None = None,
    max_records: int | None = None,
    skip_invalid: bool = False,
    prompt_words: int = 1,
    extra_fields: tuple[str, ...] = (),
    hh_conversations: bool = False,
    file_reading: FileReading = "by_name",
) -> SourceExamples:
    """The ``kind`` examples of ``source`` read in ``format`` (at most ``max_records`` records; a hub dataset's
    ``split`` and ``subset``), that format (``auto`` resolved on the source's first record; a plain-text
    file read by its name is ``paragraphs``), the records read and each example's record (:class:`SourceExamples`).
    ``hh_conversations``: HH transcripts read as conversations (:mod:`rlhf_lit.data.hh`). A source with no usable
    example is one ``ValueError`` naming it."""
    text_file = file_reading == "by_name" and is_text_file(source)
    if text_file and format not in ("paragraphs", AUTO):
        raise ValueError(f"{source} is plain text, which only the 'paragraphs' format reads (format is {format!r})")
    rows = read_rows(
        source, split=split, subset=subset, max_records=max_records, skip_invalid=skip_invalid, reading=file_reading
    )
    if not rows:
        raise ValueError(f"{source}: no usable {kind} examples in 0 records")
    format = resolve_format(format, rows, kind=kind, fields=fields, source=source, text_file=text_file)
    check_format(format, kind)
    check_fields(format, fields)
    options = AdapterOptions(fields, prompt_words, extra_fields, hh_conversations=hh_conversations)
    adapted = adapt(rows, format=format, kind=kind, options=options, skip_invalid=skip_invalid, source=source)
    if not adapted.examples:
        raise ValueError(f"{source}: no usable {kind} examples in {len(rows)} records")
    return SourceExamples(adapted.examples, format, len(rows), adapted.positions)


def check_val_split(train_path: str, val_path: str | None, val_split: str | None, val_fraction: float) -> None:
    """Refuse a ``val_split`` no source can give: beside ``val_fraction``, or of a local file (a split is a hub
    dataset's); both name the options."""
    if val_split is None:
        return
    if val_fraction > 0:
        raise ValueError(f"give either val_split ({val_split!r}) or val_fraction ({val_fraction}), not both")
    option, source = ("val_path", val_path) if val_path is not None else ("train_path", train_path)
    if is_local_source(source):
        raise ValueError(
            f"val_split {val_split!r} names a split of a hub dataset, but {option} {source} is a local file; "
            "give the validation file as val_path and leave val_split unset"
        )


def validation_source(
    train_path: str, val_path: str | None, val_split: str | None, split: str
) -> tuple[str, str] | None:
    """Where a data module reads its validation examples: ``(source, hub split)``, or None when they are not read
    from a source of their own (none, or ``val_fraction`` of the training examples). ``val_path`` is read with
    ``val_split``, else with the training ``split``; ``val_split`` alone is the training dataset's split of that name."""
    if val_split is None:
        return None if val_path is None else (val_path, split)
    return (val_path if val_path is not None else train_path), val_split

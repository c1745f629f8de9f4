"""Reading raw records from a local file or a hub dataset, and validating their fields.

A *source* is a local path if it exists, else a Hugging Face hub dataset name. A string that
looks like a path (starts with ``./``, ``../``, ``/`` or ``~``, or ends in ``.jsonl``, ``.json``,
``.txt`` or ``.gz``) but does not exist raises ``FileNotFoundError``; it is never sent to the hub.

Local files, chosen by suffix (``.gz`` of any of them is read transparently):

- ``.jsonl``: one JSON object per line (blank lines ignored);
- ``.json``: a JSON array of objects (a file whose first character is not ``[`` is read as JSONL);
- ``.txt``: plain text paragraphs separated by blank lines, each becoming ``{"text": paragraph}``.

Prompt sources (:mod:`rlhf_lit.data.prompt_source`) may read a local file otherwise than its name says
(:data:`FileReading`): ``lines``, one record ``{"text": line}`` per non-blank line, kept as written; ``jsonl``,
JSON lines whatever the name.

A hub dataset is read with ``datasets.load_dataset(name, subset, split=split)``; a split it does not have
is one ``ValueError`` naming the dataset, the split and the splits it has.

A field given twice in one JSON object (at any depth) is refused as a bad record: JSON readers keep the last.

Every record is a :class:`Row` carrying ``where`` (e.g. ``"data/x.jsonl line 17"``), so that an
error names the file, the line (record index for JSON arrays and hub rows) and the field.
"""

from __future__ import annotations

import gzip
import json
import logging
import math
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

log = logging.getLogger("rlhf_lit.data")

_PATH_PREFIXES = ("./", "../", "/", "~")
_PATH_SUFFIXES = (".jsonl", ".json", ".txt", ".gz")


FileReading = Literal["by_name", "lines", "jsonl"]
"""How a local file is read: by its name (the module docstring), one record per non-blank line, or as JSON lines."""


class InvalidRecord(ValueError):
    """A record (or a JSONL line) that fails validation; ``skip_invalid=True`` skips these."""


@dataclass(frozen=True)
class Row:
    """One raw record and where it came from (for error messages)."""

    where: str
    data: dict[str, Any]


def looks_like_path(source: str) -> bool:
    """True for strings that are meant as local paths (and so never looked up on the hub)."""
    return source.startswith(_PATH_PREFIXES) or source.endswith(_PATH_SUFFIXES)


def is_local_source(source: str) -> bool:
    """True when ``source`` is read as a local file (it exists, or looks like a path), never from the hub."""
    return os.path.exists(os.path.expanduser(source)) or looks_like_path(source)


def is_text_file(source: str) -> bool:
    """True when ``source`` is a local plain-text (paragraphs) file, ``.txt`` or ``.txt.gz``."""
    return os.path.exists(os.path.expanduser(source)) and _strip_gz(source).endswith(".txt")


def read_rows(
    source: str,
    *,
    split: str = "train",
    subset: str | None = None,
    max_records: int | None = None,
    skip_invalid: bool = False,
    reading: FileReading = "by_name",
) -> list[Row]:
    """Read at most ``max_records`` records from a local file (read as ``reading`` says) or a hub dataset.

    Lines of a JSONL file that do not parse raise ``InvalidRecord`` naming the file and the line,
    unless ``skip_invalid`` is set: then they are skipped, counted and the count logged once.
    """
    if max_records is not None and max_records < 1:
        raise ValueError(f"max_records must be >= 1 or None, got {max_records}")
    if source.startswith("~"):
        source = os.path.expanduser(source)
    if os.path.exists(source):
        if os.path.isdir(source):
            raise ValueError(f"{source} is a directory; give a .jsonl, .json or .txt file (optionally .gz)")
        rows = _read_file(source, skip_invalid=skip_invalid, reading=reading)
    elif looks_like_path(source):
        raise FileNotFoundError(f"data file not found: {source}")
    else:
        rows = _read_hub(source, split=split, subset=subset)
    out: list[Row] = []
    for row in rows:
        if max_records is not None and len(out) >= max_records:
            break
        out.append(row)
    if rows_skipped := getattr(rows, "skipped", 0):
        log.info("%s: skipped %d lines that do not parse as a JSON object with each key once", source, rows_skipped)
    return out


# ---------------------------------------------------------------------------------- local files


def _strip_gz(path: str) -> str:
    return path[: -len(".gz")] if path.endswith(".gz") else path


def _read_text(path: str) -> str:
    """The whole file as text: gunzipped when ``.gz``, UTF-8 with an optional byte-order mark.

    Raises ValueError naming the file (and the line of the first undecodable byte) for a file that
    is not UTF-8 or a ``.gz`` that is truncated or corrupt, instead of a bare decoder error.
    """
    with open(path, "rb") as f:
        raw = f.read()
    if path.endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as e:
            raise ValueError(f"{path}: not a complete gzip file ({e}); is it truncated?") from None
    try:
        # utf-8-sig drops a leading byte-order mark (editors on Windows write one).
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ValueError(
            f"{path} line {line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
            "re-encode the file as UTF-8"
        ) from None


def _lines(text: str) -> list[str]:
    """``text`` cut at line feeds only (a ``\\r`` before one dropped), as JSON Lines defines a line.

    ``str.splitlines`` would also cut at U+2028, U+2029, U+0085 and other separators that JSON allows
    raw inside a string, breaking a valid record in two (model replies do hold them)."""
    return [line.removesuffix("\r") for line in text.split("\n")]


class _Repeated(dict):
    """A JSON object holding, at ``repeated`` (``.key``, ``.key[1].key``: a path into it), a key written twice."""

    repeated: str


def _object(pairs: list[tuple[str, Any]]) -> dict:
    """A JSON object as a dict, a :class:`_Repeated` one when it or an object inside it writes a key twice.

    Python's JSON reader keeps the last of two equal keys without a word: a record with two ``chosen`` would
    train on one of them unseen. Marking the object (rather than raising) lets the reader name the record."""
    data = dict(pairs)
    repeated = None
    if len(data) < len(pairs):
        seen: set[str] = set()
        repeated = "." + next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
    else:
        repeated = next((f".{key}{inner}" for key, value in data.items() if (inner := _repeated(value))), None)
    if repeated is None:
        return data
    marked = _Repeated(data)
    marked.repeated = repeated
    return marked


def _repeated(value: Any) -> str | None:
    """The path to a key written twice inside ``value`` (an object :func:`_object` read, or a list of them)."""
    if isinstance(value, _Repeated):
        return value.repeated
    if isinstance(value, list):
        return next((f"[{i}]{inner}" for i, item in enumerate(value) if (inner := _repeated(item))), None)
    return None


def _record_problem(data: Any) -> str | None:
    """What makes a parsed JSON value no record, or None: not an object, or a key in it written twice."""
    if not isinstance(data, dict):
        return f"expected a JSON object, got {type(data).__name__}"
    if (repeated := _repeated(data)) is not None:
        return f"field {repeated[1:]!r} is given twice; JSON keeps only the last: remove one"
    return None


class _SkippingReader:
    """Iterates rows of a JSONL file; ``skipped`` counts unparseable lines seen so far."""

    def __init__(self, path: str, lines: Iterator[tuple[int, str]], skip_invalid: bool):
        self.path, self.lines, self.skip_invalid, self.skipped = path, lines, skip_invalid, 0

    def __iter__(self) -> Iterator[Row]:
        for lineno, line in self.lines:
            if not line.strip():
                continue
            where = f"{self.path} line {lineno}"
            try:
                data = json.loads(line, object_pairs_hook=_object)
                problem = _record_problem(data)
            except json.JSONDecodeError as e:
                problem = (
                    f"not valid JSON ({e.msg} at column {e.colno}); a data module's skip_invalid: true skips such lines"
                )
            if problem is None:
                yield Row(where, data)
            elif self.skip_invalid:
                self.skipped += 1
            else:
                raise InvalidRecord(f"{where}: {problem}")


def _read_file(path: str, *, skip_invalid: bool, reading: FileReading) -> Any:
    kind = _strip_gz(path)
    text = _read_text(path)
    if reading == "lines":
        return _line_rows(path, text)
    if reading == "jsonl":
        _check_not_one_document(path, text)
        return _SkippingReader(path, enumerate(_lines(text), start=1), skip_invalid)
    if kind.endswith(".txt"):
        return _paragraph_rows(path, text)
    if kind.endswith(".json") and text.lstrip().startswith("["):
        return _json_array_rows(path, text)
    if kind.endswith((".jsonl", ".json")):
        _check_not_one_document(path, text)
        return _SkippingReader(path, enumerate(_lines(text), start=1), skip_invalid)
    raise ValueError(
        f"{path}: unsupported file type; use .jsonl, .json (an array of records) or .txt "
        "(blank-line separated paragraphs), optionally gzipped (.gz)"
    )


def _check_not_one_document(path: str, text: str) -> None:
    """Refuse a file read as JSON Lines that holds one JSON value over several lines (``json.dump(..., indent=2)``):
    its first line alone is no JSON, which the line reader would call invalid and ``skip_invalid`` skip, line
    by line, down to "no usable examples"."""
    lines = _lines(text.removesuffix("\n"))
    first = next((line for line in lines if line.strip()), None)
    if first is None:
        return
    try:
        json.loads(first)
        return
    except json.JSONDecodeError:
        pass
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        return  # a bad line, which the line reader names
    if isinstance(whole, list):
        raise ValueError(
            f"{path}: one JSON array over {len(lines)} lines, not JSON Lines (one record a line); "
            "name the file .json to read it as an array of records"
        )
    held = f"one JSON object over {len(lines)} lines"
    if isinstance(whole, dict):
        held += f" (keys: {', '.join(map(str, list(whole)[:8])) or 'none'})"
    raise ValueError(
        f"{path}: {held}, not JSON Lines; write one record a line (JSON Lines), or a .json array of records"
    )


def _json_array_rows(path: str, text: str) -> list[Row]:
    try:
        items = json.loads(text, object_pairs_hook=_object)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} line {e.lineno}: not valid JSON ({e.msg})") from None
    rows = []
    for i, item in enumerate(items):
        where = f"{path} record {i}"
        if (problem := _record_problem(item)) is not None:
            raise InvalidRecord(f"{where}: {problem}")
        rows.append(Row(where, item))
    return rows


def _line_rows(path: str, text: str) -> list[Row]:
    """One record ``{"text": line}`` per line that is not blank, the line as written (without its line break)."""
    return [Row(f"{path} line {n}", {"text": line}) for n, line in enumerate(_lines(text), start=1) if line.strip()]


def _paragraph_rows(path: str, text: str) -> list[Row]:
    """Blank-line separated paragraphs (whitespace-only lines count as blank), each stripped."""
    rows: list[Row] = []
    buf: list[str] = []
    first = 0
    for lineno, line in enumerate([*_lines(text), ""], start=1):
        if line.strip():
            first = first if buf else lineno
            buf.append(line)
        elif buf:
            rows.append(Row(f"{path} line {first}", {"text": "\n".join(buf).strip()}))
            buf = []
    return rows


# ------------------------------------------------------------------------------------------ hub


def _read_hub(name: str, *, split: str, subset: str | None) -> Iterator[Row]:
    try:
        import datasets  # optional: only needed for hub names
    except ImportError:
        raise ImportError(
            f"{name!r} is not a local file, so it is read from the Hugging Face hub, which needs "
            "the `datasets` library: pip install 'rlhf-lit[hub]'"
        ) from None
    label = f"hub dataset {name!r}" + (f" ({subset})" if subset else "") + f" split {split!r}"
    try:
        ds = datasets.load_dataset(name, subset, split=split)
    except ValueError as error:
        # datasets says 'Unknown split "x". Should be one of [...]'; anything else is passed on, named
        if "split" not in str(error).lower():
            raise ValueError(f"{label}: {error}") from None
        raise ValueError(f"{label}: no such split; {_split_names(datasets, name, subset, error)}") from None
    for i, data in enumerate(ds):
        where = f"{label} row {i}"
        if not isinstance(data, dict):
            raise InvalidRecord(f"{where}: expected a record (dict), got {type(data).__name__}")
        yield Row(where, data)


def _split_names(datasets: Any, name: str, subset: str | None, error: ValueError) -> str:
    """The splits the dataset has, as a clause, or datasets' own words when they cannot be listed."""
    try:
        names = datasets.get_dataset_split_names(name, subset)
    except Exception:  # noqa: BLE001  (offline, or a loader that cannot list them: datasets' message says it)
        return f"datasets says: {error}"
    return "its splits: " + ", ".join(map(str, names))


# ------------------------------------------------------------------------------------ validation


def missing_field(row: Row, field: str) -> InvalidRecord:
    """The error for a record without ``field``, listing the keys it has."""
    keys = ", ".join(map(str, row.data)) or "none"
    return InvalidRecord(f"{row.where}: field {field!r} missing (record keys: {keys})")


def get_list(row: Row, field: str, of: str) -> list:
    """The list in ``row.data[field]``; ``of`` names its items in the error (``"strings"``, ``"messages"``)."""
    if field not in row.data:
        raise missing_field(row, field)
    value = row.data[field]
    if not isinstance(value, list):
        raise InvalidRecord(f"{row.where}: field {field!r} must be a list of {of}, got {type(value).__name__}")
    return value


def get_text(row: Row, field: str, *, required: bool = True) -> str:
    """The string in ``row.data[field]``; raises ``InvalidRecord`` naming the place and field.

    A required field must be present, a string, and not empty or whitespace only. An optional
    field (``required=False``) may be missing or ``None`` (read as ``""``) but must be a string.
    """
    data = row.data
    if field not in data or (not required and data[field] is None):
        if not required:
            return ""
        raise missing_field(row, field)
    value = data[field]
    if not isinstance(value, str):
        raise InvalidRecord(f"{row.where}: field {field!r} must be a string, got {type(value).__name__}")
    if required and not value.strip():
        raise InvalidRecord(f"{row.where}: field {field!r} is empty")
    return value


def get_number(row: Row, field: str) -> float:
    """The number in ``row.data[field]`` as a float (bools are rejected)."""
    data = row.data
    if field not in data:
        raise missing_field(row, field)
    value = data[field]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRecord(f"{row.where}: field {field!r} must be a number, got {type(value).__name__}")
    return float(value)


def get_finite_number(row: Row, field: str, *, nullable: bool = False) -> float | None:
    """The finite number in ``row.data[field]`` as a float (bools are rejected, as by :func:`get_number`); with
    ``nullable``, ``null`` (a value not measured) reads as None.

    NaN and infinities are refused: Python's JSON reader takes them (``NaN``, ``Infinity``), and a mean over
    one of them would be printed and plotted as a result.
    """
    if field not in row.data:
        raise missing_field(row, field)
    value = row.data[field]
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "a number or null" if nullable else "a number"
        raise InvalidRecord(f"{row.where}: field {field!r} must be {kind}, got {type(value).__name__}")
    if not math.isfinite(value):
        raise InvalidRecord(f"{row.where}: field {field!r} is {value}, not a finite number")
    return float(value)


def get_int(row: Row, field: str, *, least: int = 0, nullable: bool = False) -> int | None:
    """The int of at least ``least`` in ``row.data[field]`` (a count; bools are rejected); with ``nullable``,
    ``null`` (a value not measured) reads as None."""
    if field not in row.data:
        raise missing_field(row, field)
    value = row.data[field]
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "an int or null" if nullable else "an int"
        raise InvalidRecord(f"{row.where}: field {field!r} must be {kind}, got {type(value).__name__}")
    if value < least:
        raise InvalidRecord(f"{row.where}: field {field!r} is {value}, below {least}")
    return value

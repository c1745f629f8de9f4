"""Cheap checks of the files rlhf-lit reads back, before any of them is loaded.

A crash, a full disk or a copy cut short leaves files that the loaders answer with a traceback and
no file name (torch: "PytorchStreamReader failed reading zip archive: failed finding central
directory"; safetensors: "Error while deserializing header: incomplete metadata"). Each check here
reads only what tells a damaged file from an intact one, never the whole file:

- a PyTorch / Lightning checkpoint (``.ckpt``, ``pytorch_model.bin``): the zip directory at its end,
  its ``data.pkl`` and the tensor records the pickle names (its opcodes are scanned, never run);
- a ``.safetensors`` file: the 8-byte header length, the JSON header, and the file's size against
  the end of the last tensor the header places;
- a JSON file (``config.json``, tokenizer files, markers, ``ensemble.json``): parsed, and an object;
- a JSON Lines file the demo wrote and reads back (``preferences.jsonl``): each line parsed;
- a model directory: each of the above that it holds, and that it holds weights at all.

Every check raises :class:`DamagedFile` (a ``ValueError``: the CLI prints it as one line) whose
message starts with the file's path and says what is wrong. Stdlib only: this module sits at the
bottom of the package (layer 0) so that every reader can use it.
"""

from __future__ import annotations

import json
import os
import pickletools
import struct
import zipfile

ZIP_START = b"PK\x03\x04"
"""The first bytes of a zip archive (and so of every checkpoint ``torch.save`` writes)."""
LEGACY_TORCH_START = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19"
"""The first bytes of a file ``torch.save`` wrote before torch 1.6 (a pickled magic number); torch
still loads such files (an old ``pytorch_model.bin``), and they have no directory to check."""
WEIGHT_NAMES = ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors", "adapter_model.bin")
"""The single-file weights a Hugging Face model directory (or a peft adapter) may hold."""
JSON_NAMES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "preprocessor_config.json",
    "chat_template.json",
    "adapter_config.json",
    "rlhf_lit_export.json",
)
"""The JSON files of a model directory that a loader (transformers, peft, rlhf-lit) reads: other JSON
files beside them (a trainer's ``trainer_state.json``, results) are not the model's and not checked."""
INDEX_NAMES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
"""The index of a model saved in shards: it names every shard file."""
SAFETENSORS_MAX_HEADER = 100_000_000
"""The largest header the safetensors library reads: a longer one means the file is of another kind."""
PLAIN_FILES = (
    "merges.txt",
    "tokenizer.model",
    "vocab.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "chat_template.jinja",
)
"""Tokenizer files that are not JSON: checked for being empty here (an empty ``chat_template.jinja``
would load as no chat template at all); a chat template cut short is found by
:func:`rlhf_lit.sources.check_source_files`, which may import jinja2."""


class DamagedFile(ValueError):
    """A file that cannot be what it should be: cut short, empty, of another format, or incomplete.

    Attributes:
        path: the file (or directory) as given.
        problem: what is wrong with it, in words.
    """

    def __init__(self, path: str | os.PathLike, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = str(path), problem

    def __reduce__(self):  # pickled by its fields (ddp_spawn), not by the formatted message
        return type(self), (self.path, self.problem)


def _size(path: str) -> int:
    """The file's size; an empty file is damaged whatever its kind."""
    size = os.path.getsize(path)
    if size == 0:
        raise DamagedFile(path, "the file is empty (0 bytes)")
    return size


def check_json_file(path: str | os.PathLike, *, want_object: bool = True) -> object:
    """Parse the JSON file at ``path`` and return its value; :class:`DamagedFile` when it does not parse
    (or, with ``want_object``, is not a JSON object)."""
    path = str(path)
    _size(path)
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except UnicodeDecodeError as error:
        raise DamagedFile(
            path, f"not JSON text (byte 0x{error.object[error.start]:02x} at offset {error.start} is not UTF-8)"
        ) from None
    except json.JSONDecodeError as error:
        # the text ended before the value did (in a string, the error points at where the string began)
        cut = error.pos >= len(error.doc.rstrip()) or error.msg.startswith("Unterminated string")
        why = "cut short" if cut else "not valid JSON"
        raise DamagedFile(path, f"{why} (line {error.lineno}, column {error.colno}: {error.msg})") from None
    if want_object and not isinstance(value, dict):
        raise DamagedFile(path, f"expected a JSON object, found {type(value).__name__}")
    return value


def check_jsonl_file(path: str | os.PathLike) -> list:
    """The records of the JSON Lines file at ``path`` (blank lines skipped); :class:`DamagedFile` naming
    the line when one does not parse (``cut short`` when it is the last line and the file does not end
    with a line break: a write or a copy that stopped there)."""
    path = str(path)
    _size(path)
    with open(path, "rb") as f:
        data = f.read()
    records = []
    lines = data.split(b"\n")
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            records.append(json.loads(raw.decode("utf-8")))
        except UnicodeDecodeError as error:
            raise DamagedFile(path, f"line {number}: not UTF-8 text (byte 0x{raw[error.start]:02x})") from None
        except json.JSONDecodeError as error:
            why = "cut short" if number == len(lines) else "not valid JSON"
            raise DamagedFile(path, f"line {number}: {why} (column {error.colno}: {error.msg})") from None
    return records


_GLOBAL = object()
"""Stands for a class a pickle pushes (the storage type of a tensor record)."""


def _storage_keys(pickle_bytes: bytes) -> list[str]:
    """The tensor records a torch pickle refers to, read from its opcodes without running it.

    ``torch.save`` pickles each storage as the persistent id ``("storage", <type>, <key>, <device>,
    <numel>)``. The pickle's stack is followed just far enough to see the tuple each ``BINPERSID``
    takes: strings and classes as themselves (memoised ones fetched back), anything else as None,
    so a user's string "storage" elsewhere in the checkpoint is never taken for a record.
    """
    keys: list[str] = []
    memo: dict[int, object] = {}
    stack: list[object] = []
    frames: list[list[object]] = []  # the stacks below each MARK
    for opcode, arg, _ in pickletools.genops(pickle_bytes):
        name, before, after = opcode.name, opcode.stack_before, opcode.stack_after
        if name == "MARK":
            frames.append(stack)
            stack = []
            continue
        if name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):  # the top is remembered, the stack unchanged
            memo[len(memo) if name == "MEMOIZE" else int(arg)] = stack[-1] if stack else None
            continue
        if name == "BINPERSID" and stack:
            record = stack[-1]
            if isinstance(record, tuple) and len(record) >= 3 and record[0] == "storage" and isinstance(record[2], str):
                keys.append(record[2])
            continue
        if pickletools.markobject in before:  # TUPLE, LIST, DICT, APPENDS, SETITEMS, ...: the items since MARK
            items, stack = stack, (frames.pop() if frames else [])
            del stack[len(stack) - before.index(pickletools.markobject) :]  # what lay below the mark (a list)
            value: object = tuple(items) if name == "TUPLE" else None
        else:
            del stack[len(stack) - min(len(before), len(stack)) :]
            value = (
                memo.get(int(arg))
                if name in ("GET", "BINGET", "LONG_BINGET")
                else _GLOBAL
                if name in ("GLOBAL", "STACK_GLOBAL")
                else arg
                if isinstance(arg, str) and "UNICODE" in name
                else None
            )
        stack.extend([value, *[None] * (len(after) - 1)] if after else [])
    return keys


def check_torch_file(path: str | os.PathLike) -> None:
    """Check a file ``torch.save`` wrote (a Lightning checkpoint, ``pytorch_model.bin``) without loading it.

    Reads the zip directory, the pickle (scanned, never run) and the names of the tensor records.
    """
    path = str(path)
    size = _size(path)
    with open(path, "rb") as f:
        start = f.read(len(LEGACY_TORCH_START))
    if start == LEGACY_TORCH_START:
        return  # the format before torch 1.6: readable, and nothing cheap to check in it
    if not start.startswith(ZIP_START):
        raise DamagedFile(path, "not a PyTorch checkpoint (it does not start as a zip archive)")
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            pickles = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
            if not pickles:
                raise DamagedFile(path, "incomplete checkpoint: it holds no data.pkl")
            prefix = pickles[0][: -len("data.pkl")]
            try:
                keys = _storage_keys(archive.read(pickles[0]))
            except (ValueError, zipfile.BadZipFile, EOFError) as error:
                raise DamagedFile(path, f"damaged checkpoint: {pickles[0]} cannot be read ({error})") from None
    except zipfile.BadZipFile:
        raise DamagedFile(
            path, f"cut short ({size} bytes, and the zip directory that ends a complete checkpoint is missing)"
        ) from None
    missing = sorted(set(keys) - {n[len(prefix) + len("data/") :] for n in names if n.startswith(prefix + "data/")})
    if missing:
        raise DamagedFile(
            path, f"incomplete checkpoint: {len(missing)} tensor record(s) missing ({prefix}data/{missing[0]} ...)"
        )


def check_checkpoint(path: str | os.PathLike) -> None:
    """Check a Lightning checkpoint: a file (:func:`check_torch_file`) or a sharded checkpoint
    directory (its ``.metadata`` and ``meta.pt`` must be there)."""
    path = str(path)
    if os.path.isdir(path):
        for name in (".metadata", "meta.pt"):
            if not os.path.isfile(os.path.join(path, name)):
                raise DamagedFile(path, f"incomplete checkpoint directory: no {name} in it")
            _size(os.path.join(path, name))
        check_torch_file(os.path.join(path, "meta.pt"))
        return
    check_torch_file(path)


def check_safetensors(path: str | os.PathLike) -> None:
    """Check a ``.safetensors`` file: its header, and that the file holds every byte the header places."""
    path = str(path)
    size = _size(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise DamagedFile(path, f"cut short ({size} bytes: not even the 8-byte header length)")
        (length,) = struct.unpack("<Q", head)
        if 8 + length > size:
            why = "cut short" if length <= SAFETENSORS_MAX_HEADER else "not a safetensors file"
            raise DamagedFile(path, f"{why} ({size} bytes; its header alone says {8 + length})")
        raw = f.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise DamagedFile(path, "not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise DamagedFile(path, "not a safetensors file (its header is not a JSON object)")
    try:
        end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
    except (TypeError, KeyError, IndexError, ValueError):
        raise DamagedFile(path, "not a safetensors file (a tensor in its header has no data_offsets)") from None
    if 8 + length + end > size:
        raise DamagedFile(path, f"cut short ({size} bytes; its tensors end at byte {8 + length + end})")


def _check_weights(path: str, name: str) -> None:
    """Check one weight file by its kind (safetensors, or a torch zip)."""
    full = os.path.join(path, name)
    check_safetensors(full) if name.endswith(".safetensors") else check_torch_file(full)


def check_model_directory(path: str | os.PathLike, *, needs_weights: bool = True) -> None:
    """Check every file of a Hugging Face model directory (an rlhf-lit export, a saved model) that a
    loader will read: its JSON files (:data:`JSON_NAMES`, the shard indexes), its non-JSON tokenizer
    files (not empty), its weights (single files, or the shards its index names, each present), and,
    with ``needs_weights``, that it holds weights at all. Raises :class:`DamagedFile` for the first
    damaged file."""
    path = str(path)
    names = set(os.listdir(path))
    for name in sorted(names):
        full = os.path.join(path, name)
        if not os.path.isfile(full):
            continue
        if name in JSON_NAMES or name in INDEX_NAMES:
            check_json_file(full)
        elif name in PLAIN_FILES:
            _size(full)
    indexed: set[str] = set()
    for index_name in INDEX_NAMES:
        if index_name in names:
            weight_map = check_json_file(os.path.join(path, index_name)).get("weight_map")  # type: ignore[union-attr]
            if not isinstance(weight_map, dict):
                raise DamagedFile(os.path.join(path, index_name), "no weight_map in it")
            for shard in sorted(set(map(str, weight_map.values()))):
                if shard not in names:
                    raise DamagedFile(os.path.join(path, shard), f"missing (named by {index_name})")
                indexed.add(shard)
    single = [n for n in WEIGHT_NAMES if n in names]
    for name in [*single, *sorted(indexed)]:
        _check_weights(path, name)
    if needs_weights and not single and not indexed:
        raise DamagedFile(path, f"holds no weights (none of {', '.join(WEIGHT_NAMES[:2])} or a shard index)")


def newest_intact_checkpoint(damaged: str | os.PathLike) -> str | None:
    """The newest checkpoint beside ``damaged`` (same directory, ``.ckpt``, by modification time) that
    passes :func:`check_checkpoint`, or None."""
    damaged = os.path.abspath(str(damaged))
    folder = os.path.dirname(damaged)
    try:
        entries = [os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".ckpt") and not n.startswith(".")]
    except OSError:
        return None
    candidates = sorted(
        (p for p in entries if os.path.abspath(p) != damaged), key=lambda p: (os.path.getmtime(p), p), reverse=True
    )
    for candidate in candidates:
        try:
            check_checkpoint(candidate)
        except (DamagedFile, OSError):
            continue
        return candidate
    return None

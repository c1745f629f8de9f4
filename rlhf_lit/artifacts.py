"""What rlhf-lit writes to disk, and the one rule for it: atomic, and never over what it did not write.

Every output of rlhf-lit (exports, checkpoints, command results, the demo's folders) follows it:

- **Atomic**: a file or directory is written whole under a hidden temporary name beside its
  target (same directory, so same filesystem) and renamed into place with ``os.replace``; a
  crash leaves the old complete version or the new complete one, never a part.
- **Owned**: what rlhf-lit writes carries a mark of it. A directory holds a marker file (the
  export's :data:`EXPORT_MARKER`, the demo's own); a JSON file a ``written_by`` key
  (:data:`WRITTEN_BY_KEY`). Only an owned target is ever replaced or cleared, and only when the
  caller was asked to; anything else (a user's folder, a file of someone else's) is refused.

This module says what a target *is* (:func:`directory_state`, :func:`json_file_state`) and does
the writes; callers phrase their own refusals (each names its option). Standard library only, so
every layer may import it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

EXPORT_MARKER = "rlhf_lit_export.json"
"""Written into every model export (what it is and when it was written); only such a directory is replaced."""

REWARD_MODEL_EXPORT = "reward model"
"""The :data:`EXPORT_MARKER`'s ``what`` of a reward-model export (the reward-model stage's, one model or an
ensemble): what a judge given as a directory must be."""

CHAT_RENDERED_KEY = "chat_rendered"
"""The :data:`EXPORT_MARKER`'s entry saying whether the model was trained on prompts rendered with its chat
template (a reward-model export's; a judge reads prompts as it says)."""

WRITTEN_BY_KEY = "written_by"
"""Key of the mark in a JSON file rlhf-lit writes (``"rlhf-lit <command>"``)."""

DirectoryState = Literal["absent", "not_a_directory", "empty", "owned", "foreign"]
"""What a directory target is: ``absent`` (nothing there), ``not_a_directory`` (a file, or a link
unless followed), ``empty``, ``owned`` (holds the marker file) or ``foreign`` (entries and no marker)."""

FileState = Literal["absent", "directory", "owned", "foreign"]
"""What a JSON file target is: ``owned`` when its ``written_by`` starts with the owner's prefix."""


class NotOwned(ValueError):
    """A directory that would be cleared or replaced does not carry its marker: it is left as it is."""


# ------------------------------------------------------------------------------------- files
def write_bytes_atomically(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it and one ``os.replace``.

    The parent directory is created when missing. The file gets the permissions a plain
    ``open(path, "wb")`` would give it (``0o666`` less the umask); the temporary file is removed
    when the write fails.
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    # a fresh name (O_EXCL): never someone else's file, and two writers never share one
    tmp = final.parent / f".{final.name}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomically(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> None:
    """:func:`write_bytes_atomically` of ``text`` encoded."""
    write_bytes_atomically(path, text.encode(encoding))


def write_json_atomically(path: str | os.PathLike, obj: Any, *, indent: int = 1, ensure_ascii: bool = False) -> None:
    """``obj`` as JSON (``indent`` 1, non-ASCII kept, a final line break), written atomically."""
    write_text_atomically(path, json.dumps(obj, indent=indent, ensure_ascii=ensure_ascii) + "\n")


def write_jsonl_atomically(path: str | os.PathLike, records: Iterable[Any]) -> None:
    """``records`` as JSON Lines (one object a line, non-ASCII kept), written atomically: the one JSONL writer
    of rlhf-lit and its demos (a crash never leaves half a file under the real name)."""
    write_text_atomically(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def json_file_state(path: str | os.PathLike, owner_prefix: str) -> FileState:
    """What the JSON file at ``path`` is: ``owned`` when its :data:`WRITTEN_BY_KEY` starts with ``owner_prefix``.

    A file that cannot be read or parsed, or is not a JSON object, is ``foreign``.
    """
    if not os.path.lexists(path):
        return "absent"
    if os.path.isdir(path):
        return "directory"
    try:
        with open(path, encoding="utf-8") as f:
            written_by = json.load(f).get(WRITTEN_BY_KEY, "")
    except (OSError, ValueError, AttributeError):
        written_by = ""
    return "owned" if str(written_by).startswith(owner_prefix) else "foreign"


def jsonl_file_state(path: str | os.PathLike, owner_prefix: str) -> FileState:
    """What the JSON Lines file at ``path`` is: ``owned`` when its first record's :data:`WRITTEN_BY_KEY` starts
    with ``owner_prefix`` (rlhf-lit stamps every record of a JSONL file it writes). An empty file, or a first
    line that cannot be read or parsed as a JSON object, is ``foreign``."""
    if not os.path.lexists(path):
        return "absent"
    if os.path.isdir(path):
        return "directory"
    try:
        with open(path, encoding="utf-8", newline="\n") as f:
            written_by = json.loads(f.readline()).get(WRITTEN_BY_KEY, "")
    except (OSError, ValueError, AttributeError):
        written_by = ""
    return "owned" if str(written_by).startswith(owner_prefix) else "foreign"


# ------------------------------------------------------------------------------- directories
def directory_state(path: str | os.PathLike, marker: str, *, follow_symlinks: bool = False) -> DirectoryState:
    """What the directory target ``path`` is, given the name of its owner's marker file.

    Args:
        path: the target.
        marker: the file name an owned directory holds.
        follow_symlinks: a link to a directory counts as that directory (for a folder that is
            written into, never swapped); otherwise a link is ``not_a_directory`` (a swap would
            replace the link, not what it points to).
    """
    target = Path(path)
    if not target.exists() and not target.is_symlink():
        return "absent"
    if not target.is_dir() or (target.is_symlink() and not follow_symlinks):
        return "not_a_directory"
    if not any(target.iterdir()):
        return "empty"
    return "owned" if (target / marker).is_file() else "foreign"


def claim_directory(path: str | os.PathLike, marker: str, content: str) -> bool:
    """Make ``path`` an owned directory: create it (and its parents) and write ``marker`` unless it is there.

    The caller has checked :func:`directory_state` (``absent``, ``empty`` or ``owned``). Returns
    whether the marker was written now (False: it was there already and is kept as it is).
    """
    target = Path(path)
    target.mkdir(parents=True, exist_ok=True)
    if (target / marker).is_file():
        return False
    write_text_atomically(target / marker, content)
    return True


def remove_owned_directory(path: str | os.PathLike, marker: str) -> None:
    """Delete the directory ``path`` only if it holds ``marker``; :class:`NotOwned` otherwise (nothing deleted)."""
    target = Path(path)
    if target.is_symlink() or not (target / marker).is_file():
        raise NotOwned(f"{target} holds no {marker}; it is not deleted")
    shutil.rmtree(target)


def clear_owned_entries(root: str | os.PathLike, marker: str, names: Iterable[str]) -> None:
    """Remove the entries ``names`` (files or directory trees) of ``root``, which must hold ``marker``.

    Anything else in ``root`` is left alone. Raises :class:`NotOwned` (nothing removed) when
    ``root`` does not hold the marker.
    """
    base = Path(root)
    if not (base / marker).is_file():
        raise NotOwned(f"{base} holds no {marker}; nothing in it is removed")
    for name in names:
        remove_path(base / name)


class TargetChanged(ValueError):
    """The target of :func:`write_directory_atomically` lost its marker after the caller checked it; it was put back."""


def write_directory_atomically(
    path: str | os.PathLike, fill: Callable[[Path], None], marker: str, marker_content: str | Callable[[], str]
) -> Path:
    """Write a directory at ``path`` so that it is never half written, and replace only an owned one.

    ``fill(tmp)`` writes the contents into a new hidden directory beside ``path``
    (``.<name>.tmp-XXXX``); ``marker`` (with ``marker_content``, or what it returns when it is a
    function, called after ``fill``) is written last, then the
    directory is renamed into place. An earlier directory at ``path`` (the caller has checked
    that it is empty or owned) is moved aside first and deleted only after the new one is in
    place, so a crash leaves the old or the new one, never a mixture; when the rename fails it is
    put back.

    Raises:
        TargetChanged: the directory at ``path`` holds entries and no marker when moved aside
            (it changed after the caller's check): it is put back untouched and only what this
            call made is deleted.

    Returns:
        The absolute path written.
    """
    final = Path(path).absolute()
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))  # new: never someone's
    try:
        fill(tmp)
        write_text_atomically(tmp / marker, marker_content() if callable(marker_content) else marker_content)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # the directory made above, nothing else
        raise
    old = None
    if final.exists():  # an empty directory or an owned one (checked by the caller)
        old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
        os.replace(final, old / final.name)  # os.replace cannot replace a non-empty directory
        moved = old / final.name
        if any(moved.iterdir()) and not (moved / marker).is_file():
            # Changed since the check: put it back untouched and delete only what this call made.
            os.replace(moved, final)
            shutil.rmtree(tmp)
            old.rmdir()
            raise TargetChanged(f"{final} changed while it was written; it was left as it is")
    try:
        os.replace(tmp, final)
    except OSError:
        if old is not None:
            os.replace(old / final.name, final)  # the earlier directory back in place
            old.rmdir()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old)  # holds only the earlier owned directory (its marker checked just above)
    return final


# ---------------------------------------------------------------- renaming a finished write
def remove_path(path: str | os.PathLike) -> None:
    """Remove a file, link or directory tree if it exists (a link is removed, never followed)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def hidden_sibling(path: str | os.PathLike, suffix: str) -> str:
    """``<dir>/.<name><suffix>``: a hidden name beside ``path`` (same directory, so same filesystem)."""
    head, name = os.path.split(os.fspath(path))
    return os.path.join(head, f".{name}{suffix}")


def replace_path(src: str | os.PathLike, dst: str | os.PathLike, aside_suffix: str = ".old") -> None:
    """Move the finished write ``src`` to ``dst`` in one ``os.replace`` (atomic for files and links).

    A directory (a sharded checkpoint) cannot replace an existing entry in one rename: the old one
    is moved aside to ``.<name><aside_suffix>`` first and removed after, so ``dst`` is briefly
    missing but never partial.
    """
    src, dst = os.fspath(src), os.fspath(dst)
    dst_is_dir = os.path.isdir(dst) and not os.path.islink(dst)
    if dst_is_dir or (os.path.isdir(src) and os.path.lexists(dst)):
        old = hidden_sibling(dst, aside_suffix)
        remove_path(old)
        os.replace(dst, old)
        os.replace(src, dst)
        remove_path(old)
    else:
        os.replace(src, dst)

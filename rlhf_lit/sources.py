"""Where a model or tokenizer comes from: a local directory or a hub name, checked before loading.

Hugging Face's loaders answer a mistyped local path with "Repo id must be in the form
'repo_name'...", a data folder given as a model with advice to install sentencepiece, and a hub
name without network with a minute of retries and three chained tracebacks. :func:`model_source`
looks first and says what is wrong in one sentence; :func:`loading_error` turns what the loader
raises for a hub name into one sentence too.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import re
import socket
from collections.abc import Callable
from typing import Literal, TypeVar
from urllib.parse import urlparse

from rlhf_lit.artifacts import EXPORT_MARKER
from rlhf_lit.integrity import DamagedFile, check_json_file, check_model_directory

T = TypeVar("T")

HUB_PROBE_TIMEOUT_S = 3.0
"""How long to wait for the hub's host before loading from the local cache only."""


class SourceError(ValueError):
    """A model or tokenizer source that cannot be used; the message says why and what to do."""


class MissingSource(SourceError):
    """A local model path that does not exist; names the config that exports it when one is known.

    Attributes:
        what: words for the message (``"sft_model"``).
        name_or_path: the path as given.
        config: the config under ``configs/`` whose export ``name_or_path`` is, or None.
    """

    def __init__(self, what: str, name_or_path: str, config: str | None = None) -> None:
        hint = f"; it is the export of {config}: run `rlhf-lit fit --config {config}` first" if config else ""
        super().__init__(f"{what} not found: {name_or_path} (no such directory{hint})")
        self.what, self.name_or_path, self.config = what, name_or_path, config

    def __reduce__(self):  # pickled by its fields (ddp_spawn), not by the formatted message
        return type(self), (self.what, self.name_or_path, self.config)


class DamagedSource(SourceError):
    """A local model or tokenizer directory with a damaged file (cut short, empty, not its format).

    Never a reason to fall back to something else: callers that try a source and go on without it
    when it is absent re-raise this one."""


def _looks_local(name: str) -> bool:
    """A path rather than a hub id (``name`` or ``org/name``): never sent to the hub.

    ``exports/sft`` is a path when ``exports`` is a local directory (a hub organisation never is).
    """
    if name.startswith(("./", "../", "/", "~", ".\\")) or name.count("/") > 1 or "\\" in name:
        return True
    return "/" in name and os.path.isdir(name.split("/")[0])


RunDirExport = Callable[[str], str | None]
"""``config text -> export path`` for a config that sets ``run_dir`` (its ``<run_dir>/<stage>/model``).

The stage's place in a run directory is declared by the stage class, which this module cannot
import (the stages import it): the CLI, which knows the stages, passes this function down
(:func:`rlhf_lit.cli.run_dir.run_dir_export`)."""


def producing_config(path: str, run_dir_export: RunDirExport | None = None) -> str | None:
    """The config under ``configs/`` (from the working directory) whose export is ``path``.

    A config's export is its ``export_dir``, or, when it sets none, what ``run_dir_export`` reads
    from it (a config that sets ``run_dir``); without ``run_dir_export`` only ``export_dir`` counts.
    """
    wanted = os.path.normpath(path)
    for config in sorted(glob.glob(os.path.join("configs", "**", "*.yaml"), recursive=True)):
        try:
            with open(config, encoding="utf-8") as f:
                text = f.read()
        except OSError:
            continue
        exports = [m.group(1) for m in re.finditer(r"^\s*export_dir:\s*(\S+)\s*$", text, flags=re.MULTILINE)]
        if not exports and run_dir_export is not None:
            exports = [export for export in [run_dir_export(text)] if export]
        for export in exports:
            if os.path.normpath(export.strip("'\"")) == wanted:
                return config
    return None


@functools.lru_cache(maxsize=1)  # probed once per process
def _hub_reachable() -> bool:
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    parsed = urlparse(endpoint)
    try:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        with socket.create_connection((parsed.hostname or "huggingface.co", port), timeout=HUB_PROBE_TIMEOUT_S):
            return True
    except (OSError, ValueError):
        return False


def _behind_proxy() -> bool:
    """A proxy carries the hub's traffic: a direct probe says nothing, so none is made."""
    names = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
    return any(os.environ.get(n) for n in names)


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


SourceKind = Literal["model", "tokenizer"]
"""What a directory must hold: a model's ``config.json``, or a tokenizer's files (or a config)."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def model_source(name_or_path: str, what: str, kind: SourceKind = "model") -> dict[str, bool]:
    """Check ``name_or_path`` before a ``from_pretrained``; returns extra keyword arguments for it.

    A local directory must exist and hold a Hugging Face ``config.json`` (or, for a tokenizer,
    tokenizer files), and none of the files a loader reads may be damaged (:func:`check_source_files`);
    a missing path that is the export of a config under ``configs/`` (its ``export_dir``; the CLI
    adds configs that set ``run_dir``) names the command that produces it. A hub name is loaded from the local cache only
    (``local_files_only=True``) when ``HF_HUB_OFFLINE`` is set or the hub's host does not answer
    within :data:`HUB_PROBE_TIMEOUT_S`.

    Args:
        name_or_path: a hub name (``gpt2``, ``org/name``) or a local directory.
        what: words for messages, e.g. ``"reward_model"`` or ``"tokenizer"``.
        kind: what the directory must hold (:data:`SourceKind`).

    Raises:
        SourceError: a local path that does not exist (:class:`MissingSource`), is not a model directory,
            or holds a damaged file (:class:`DamagedSource`).
    """
    path = os.path.expanduser(name_or_path)
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise SourceError(f"{what} {name_or_path!r} is a file; give a model directory (with config.json)")
        has_config = os.path.exists(os.path.join(path, "config.json"))
        has_tokenizer = any(os.path.exists(os.path.join(path, f)) for f in TOKENIZER_FILES)
        if not has_config and not (kind == "tokenizer" and has_tokenizer):
            raise SourceError(f"{what} {name_or_path!r} is not a Hugging Face model directory (no config.json in it)")
        check_source_files(name_or_path, what, kind)
        return {}
    if _looks_local(name_or_path):
        raise MissingSource(what, name_or_path, producing_config(name_or_path))
    if _offline() or (not _behind_proxy() and not _hub_reachable()):
        return {"local_files_only": True}
    return {}


def check_source_files(name_or_path: str, what: str, kind: SourceKind = "model") -> None:
    """Check the files of the local directory ``name_or_path`` that a loader reads
    (:func:`rlhf_lit.integrity.check_model_directory`; weights required for a ``model``).

    Raises:
        DamagedSource: naming ``what``, the damaged file and what is wrong with it.
    """
    try:
        check_model_directory(os.path.expanduser(name_or_path), needs_weights=kind == "model")
        check_chat_templates(os.path.expanduser(name_or_path))
    except DamagedFile as error:
        raise DamagedSource(f"{what} {name_or_path!r} cannot be loaded: {error}") from None


CHAT_TEMPLATE_FILE, CHAT_TEMPLATE_DIR = "chat_template.jinja", "additional_chat_templates"
"""Where ``save_pretrained`` writes a tokenizer's chat template(s) as Jinja text (transformers 4.50 and later)."""


def chat_template_texts(path: str) -> list[tuple[str, str]]:
    """``(where, Jinja text)`` of every chat template the directory ``path`` holds: ``chat_template.jinja``,
    ``additional_chat_templates/*.jinja`` and a ``chat_template`` held in ``tokenizer_config.json`` (a string,
    or a list of named templates)."""
    files = [os.path.join(path, CHAT_TEMPLATE_FILE)]
    folder = os.path.join(path, CHAT_TEMPLATE_DIR)
    if os.path.isdir(folder):
        files += sorted(os.path.join(folder, name) for name in os.listdir(folder) if name.endswith(".jinja"))
    texts = []
    for file in filter(os.path.isfile, files):
        with open(file, encoding="utf-8", errors="replace") as f:
            texts.append((file, f.read()))
    config = os.path.join(path, "tokenizer_config.json")
    try:
        with open(config, encoding="utf-8") as f:
            held = json.load(f).get("chat_template")
    except (OSError, ValueError, AttributeError):  # missing or damaged: check_model_directory names it
        held = None
    if isinstance(held, str):
        texts.append((f"{config} (chat_template)", held))
    elif isinstance(held, list):
        texts += [
            (f"{config} (chat_template {t.get('name')!r})", t["template"])
            for t in held
            if isinstance(t, dict) and isinstance(t.get("template"), str)
        ]
    return texts


def check_chat_templates(path: str) -> None:
    """Raise :class:`DamagedFile` for a chat template of the directory ``path`` that is not valid Jinja (a
    block or expression left open by a copy cut short, a stray ``{% endfor %}``, a bad expression), naming
    the template's file and line. The tokenizer would load it as it is and fail only when a prompt is
    rendered (or, for an export whose data never render through it, copy it into the next export). A tag
    jinja2 does not know is left to the renderer: transformers adds its own (``{% generation %}``)."""
    texts = chat_template_texts(path)
    if not texts:
        return
    try:
        import jinja2
    except ImportError:  # no jinja2: no chat template can be rendered, and transformers says so
        return
    environment = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
    for where, text in texts:
        try:
            environment.parse(text)
        except jinja2.TemplateSyntaxError as error:
            unknown = re.match(r"Encountered unknown tag '(\w+)'", error.message or "")
            if unknown and not unknown.group(1).startswith(("end", "else", "elif")):
                continue  # a tag of the renderer's own (transformers' {% generation %}), not a stray closing tag
            problem = "cut short" if "end of template" in error.message.lower() else "not valid Jinja"
            raise DamagedFile(where, f"{problem} (line {error.lineno}: {error.message})") from None


def check_local_source(name_or_path: str | None, what: str) -> None:
    """Check the files of a local model directory before anything is loaded from it (a no-op for None,
    a hub name or a path that does not exist: the loader names those).

    A reward-model ensemble (a directory with ``ensemble.json``) has its manifest checked; its
    members are checked as they are loaded. Used where several models are loaded one after the
    other, so that a damaged last one stops the run before the first is loaded.

    Raises:
        DamagedSource: naming ``what``, the damaged file and what is wrong with it.
    """
    path = os.path.expanduser(name_or_path) if name_or_path else ""
    if not os.path.isdir(path):
        return
    if os.path.isfile(os.path.join(path, "ensemble.json")):
        try:
            check_json_file(os.path.join(path, "ensemble.json"))
        except DamagedFile as error:
            raise DamagedSource(f"{what} {name_or_path!r} cannot be loaded: {error}") from None
    elif os.path.isfile(os.path.join(path, "config.json")):
        check_source_files(name_or_path, what, "model")


def source_fingerprint(name_or_path: str) -> str:
    """What identifies the model at ``name_or_path`` now, to notice one replaced in place.

    A local directory: a hash of its ``config.json``, the rlhf-lit export marker (it carries the
    time of writing) and the names and sizes of its weight files. A hub name: the name itself.
    """
    path = os.path.expanduser(name_or_path)
    if not os.path.isdir(path):
        return name_or_path
    digest = hashlib.sha256()
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if name in ("config.json", EXPORT_MARKER):
            with open(full, "rb") as f:
                digest.update(name.encode() + f.read())
        elif name.endswith((".safetensors", ".bin")):
            digest.update(f"{name}:{os.path.getsize(full)}".encode())
    return digest.hexdigest()[:16]


def loading_error(name_or_path: str, what: str, error: Exception, hub_kwargs: dict[str, bool]) -> SourceError:
    """One sentence for a failed ``from_pretrained`` of a hub name (no network, not cached, no such repo)."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if hub_kwargs.get("local_files_only"):
        why = "HF_HUB_OFFLINE is set" if _offline() else "the Hugging Face hub cannot be reached"
        return SourceError(f"{what} {name_or_path!r} is not in the local Hugging Face cache and {why} ({first})")
    return SourceError(f"{what} {name_or_path!r} could not be loaded from the Hugging Face hub: {first}")


def unloadable_tokenizer(model_path: str, what: str, error: BaseException) -> DamagedSource | None:
    """The error to raise when loading the tokenizer saved with the local directory ``model_path``
    failed although it holds tokenizer files (one of them missing or unreadable: a copy cut short),
    naming them and the loader's first line; None when it holds none (it has no tokenizer)."""
    path = os.path.expanduser(model_path)
    present = [f for f in TOKENIZER_FILES if os.path.isfile(os.path.join(path, f))] if os.path.isdir(path) else []
    if not present:
        return None
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
    return DamagedSource(
        f"{what} {model_path!r} cannot be loaded: its tokenizer files ({', '.join(present)}) do not "
        f"load ({first}); restore them from the export"
    )


def from_pretrained(load: Callable[..., T], name_or_path: str, what: str, kind: SourceKind = "model", **kwargs) -> T:
    """``load(name_or_path, **kwargs)`` (a ``from_pretrained``) after :func:`model_source`'s checks.

    A hub name that fails to load (no network, not cached, no such repository) raises one
    :class:`SourceError` naming it, instead of the loader's chained tracebacks; so does a local folder whose
    tokenizer files do not parse, or whose ``config.json`` holds a value transformers cannot read.
    """
    hub_kwargs = model_source(name_or_path, what, kind)
    try:
        return load(name_or_path, **hub_kwargs, **kwargs)
    except OSError as error:
        if os.path.exists(os.path.expanduser(name_or_path)):
            raise  # a local directory the loader could not read: its own message says which file
        raise loading_error(name_or_path, what, error, hub_kwargs) from error
    except (ValueError, TypeError) as error:  # tokenizer files there that do not load: named, never a traceback
        damaged = unloadable_tokenizer(name_or_path, what, error) if kind == "tokenizer" else None
        if damaged is None:
            raise
        raise damaged from None
    except (AttributeError, KeyError) as error:  # a config.json value transformers cannot read ("dtype": "float99")
        if not os.path.isdir(os.path.expanduser(name_or_path)):
            raise
        first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
        raise DamagedSource(
            f"{what} {name_or_path!r} cannot be loaded ({type(error).__name__}: {first}): a value of its "
            "config.json is not one transformers reads; restore the file from the export"
        ) from error
    except Exception as error:  # the tokenizers library raises a bare Exception for a tokenizer.json it cannot parse
        damaged = unloadable_tokenizer(name_or_path, what, error) if kind == "tokenizer" else None
        if damaged is None:
            raise
        raise damaged from None

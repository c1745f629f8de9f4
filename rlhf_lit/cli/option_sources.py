"""Where a key of the parsed config came from: a command-line option or a line of a ``--config`` file.

jsonargparse merges the config files and options in the order given and reports a bad key without
saying where it was written. :func:`locate` reads the same command line backwards (the last
setting wins, so it is the one that failed) and finds the key in it: an option
(``--model.init_args.ppo.epochz``, ``--model.ppo.epochz``, or an option above it given a YAML
mapping or list) or a config file that holds it (its line, from the YAML's node marks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml


@dataclass(frozen=True)
class Where:
    """Where a key was given: a config file (``file``, ``line``), or a command-line ``option``.

    ``key`` is the key as found, list indexes filled in (``trainer.callbacks[1].init_args.x``): in the
    file, or, for an option given a YAML list or mapping, within that value (``[1].weight``).
    """

    option: str | None = None
    file: str | None = None
    line: int | None = None
    key: str | None = None


def given_settings(args: Sequence[str]) -> list[tuple[str, str, str | None]]:
    """The command line as ``("config", path, None)`` and ``("option", name, value)`` entries, in order."""
    entries: list[tuple[str, str, str | None]] = []
    i = 0
    while i < len(args):
        token = args[i]
        if token.startswith("--"):
            name, has_value, value = token[2:].partition("=")
            if not has_value and i + 1 < len(args) and not args[i + 1].startswith("--"):
                value, i = args[i + 1], i + 1
            entries.append(("config", value, None) if name == "config" else ("option", name, value or None))
        i += 1
    return entries


def _plain(path: Sequence[str]) -> tuple[str, ...]:
    """A key path without its ``init_args`` levels (``--model.ppo.epochs`` is ``--model.init_args.ppo.epochs``)."""
    return tuple(p for p in path if p != "init_args")


def _after(path: Sequence[str], depth: int) -> list[str]:
    """The segments of ``path`` below its first ``depth`` plain (not ``init_args``) segments."""
    seen = 0
    for i, segment in enumerate(path):
        if seen == depth:
            return list(path[i:])
        seen += segment != "init_args"
    return []


def find_in_yaml(text: str, path: Sequence[str], value: str | None = None) -> tuple[int, str] | None:
    """The line (1-based) of ``path`` in a YAML text and the key as found (list indexes filled in), or None.

    ``init_args`` may be left out in the file; in a list, the element that holds the rest of the path
    is taken (the one whose value reads ``value``, when one does).
    """
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    found = _find(root, list(path), [], value)
    if found is None:
        return None
    node, line, key = found
    return line, ".".join(key)


def _find(node, path: list[str], key: list[str], value: str | None):
    if not path:
        return node, None, key
    if isinstance(node, yaml.MappingNode):
        for key_node, child in node.value:
            if key_node.value == path[0]:
                found = _find(child, path[1:], [*key, path[0]], value)
                if found is not None:
                    return found[0], found[1] or key_node.start_mark.line + 1, found[2]
        if path[0] == "init_args":
            return _find(node, path[1:], [*key, "init_args"], value)
    if isinstance(node, yaml.SequenceNode):
        hits = [
            (i, _find(child, path, [*key[:-1], f"{key[-1]}[{i}]"] if key else [f"[{i}]"], value))
            for i, child in enumerate(node.value)
        ]
        hits = [(i, hit) for i, hit in hits if hit is not None]
        matching = [hit for _, hit in hits if isinstance(hit[0], yaml.ScalarNode) and hit[0].value == value]
        return (matching or [hit for _, hit in hits] or [None])[0]
    return None


def locate(path: Sequence[str], args: Sequence[str], value: str | None = None, cwd: Path | None = None) -> Where | None:
    """Where the setting of ``path`` that counts (the last one) was given, or None when it is not found."""
    wanted = _plain(path)
    for kind, name, given in reversed(given_settings(args)):
        if kind == "option":
            named = _plain(name.split("."))
            inline = given is not None and given.lstrip().startswith(("{", "["))
            class_given = wanted[-1:] == ("class_path",) and named == wanted[:-1]  # --model PPOModule
            if named == wanted or class_given:
                return Where(option=name)
            if inline and wanted[: len(named)] == named:  # --model.init_args.reward.sources '[{...}]'
                inner = _after(path, len(named))
                found = find_in_yaml(given, inner, value)
                return Where(option=name, key=found[1] if found else ".".join(inner))
            continue
        file = Path(name) if cwd is None or Path(name).is_absolute() else cwd / name
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        found = find_in_yaml(text, path, value)
        if found is not None:
            return Where(file=name, line=found[0], key=found[1])
    return None


def config_named(report: str, args: Sequence[str], cwd: Path | None = None) -> str:
    """A config syntax error (``ppo.yaml, line 3, column 1: ...``; jsonargparse gives the file's base name)
    with the path as given on the command line: the ``--config`` of that name that is not valid YAML."""
    name, sep, rest = report.partition(", line ")
    if not sep:
        return report
    for kind, given, _ in given_settings(args):
        file = Path(given) if cwd is None or Path(given).is_absolute() else cwd / given
        if kind == "config" and file.name == name:
            try:
                yaml.safe_load(file.read_text(encoding="utf-8"))
            except yaml.YAMLError:
                return f"{given}{sep}{rest}"
            except (OSError, UnicodeDecodeError):
                continue
    return report

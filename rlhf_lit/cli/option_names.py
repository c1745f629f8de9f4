"""The names a command line or config may use: the keys a class takes, the classes a ``class_path`` may
name, and the valid key nearest to a wrong one (what an error message suggests)."""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import sys
import typing
from collections.abc import Sequence

from rlhf_lit.callable_specs import import_class


def _dataclass_keys(prefix: str, typehint) -> list[str]:
    """``prefix.field`` for each field of a dataclass type (or ``Optional`` of one), nested ones included."""
    candidates = [a for a in typing.get_args(typehint) if a is not type(None)] or [typehint]
    keys: list[str] = []
    for candidate in candidates:
        if dataclasses.is_dataclass(candidate):
            for f in dataclasses.fields(candidate):
                keys += [f"{prefix}.{f.name}", *_dataclass_keys(f"{prefix}.{f.name}", f.type)]
    return keys


def parser_options(parser) -> list[str]:
    """Every key a jsonargparse parser takes (``ppo.epochs``), with the fields of optional dataclass options."""
    keys = []
    for action in parser._actions:
        for option in action.option_strings:
            if option.startswith("--") and option not in ("--help",) and not option.endswith((".help", "+")):
                keys.append(option[2:])
                keys += _dataclass_keys(option[2:], getattr(action, "_typehint", None))
    return list(dict.fromkeys(keys))


def class_options(class_path: str) -> list[str]:
    """The keys of a class's constructor (a stage, data module, logger, callback or dataclass)."""
    from jsonargparse import ArgumentParser

    cls = import_class(class_path)
    if cls is None:
        return []
    parser = ArgumentParser(exit_on_error=False)
    try:
        parser.add_class_arguments(cls, fail_untyped=False)
    except Exception:  # noqa: BLE001  (a suggestion is a courtesy: never let it hide the error itself)
        return []
    return parser_options(parser)


def public_path(cls: type) -> str:
    """The shortest import path of a class among the loaded modules (``rlhf_lit.stages.PPOModule``)."""
    parts = cls.__module__.split(".")
    for n in range(1, len(parts) + 1):
        module = sys.modules.get(".".join(parts[:n]))
        if module is not None and getattr(module, cls.__name__, None) is cls:
            return f"{'.'.join(parts[:n])}.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def known_subclasses(base_path: str | None, near: str | None = None) -> list[str]:
    """The concrete subclasses of a base class that a package exports (``rlhf_lit.stages.PPOModule``, not
    ``rlhf_lit.stages.base.StageModule``), among the loaded modules; only those of ``near``'s package
    when ``near`` is a class path into one (``rlhf_lit.callbacks.OnlineGen`` -> ``rlhf_lit.callbacks``)."""
    base = import_class(base_path) if base_path else None
    if base is None:
        return []
    found, todo = set(), [base]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        path = public_path(cls)
        module = sys.modules.get(path.rpartition(".")[0])
        if cls is not base and not inspect.isabstract(cls) and hasattr(module, "__path__") and "._" not in path:
            found.add(path)
    package = (near or "").rpartition(".")[0]
    same_package = sorted(p for p in found if p.rpartition(".")[0] == package)
    return same_package or sorted(found)


def nearest_option(key: Sequence[str], options: Sequence[str]) -> str | None:
    """The valid key nearest to a wrong one, segment by segment (``ppo.epochz`` -> ``ppo.epochs``), or None."""
    split = [tuple(o.split(".")) for o in options]
    fixed: list[str] = []
    for depth, segment in enumerate(key):
        names = sorted({o[depth] for o in split if len(o) > depth and o[:depth] == tuple(fixed)})
        if not names:
            return ".".join([*fixed, *key[depth:]]) if fixed else None  # below a free-form option (a dict)
        match = [segment] if segment in names else difflib.get_close_matches(segment, names, n=1, cutoff=0.6)
        if not match:
            break
        fixed.append(match[0])
    else:
        candidate = ".".join(fixed)
        return candidate if candidate != ".".join(key) else None
    # A key written at the wrong level (``epochs`` for ``ppo.epochs``): the same last name elsewhere.
    wrong = ".".join(key)
    same_name = [o for o in options if o.split(".")[-1] == key[-1] and o != wrong]
    close = same_name or difflib.get_close_matches(wrong, options, n=1, cutoff=0.75)
    return close[0] if len(close) == 1 else None

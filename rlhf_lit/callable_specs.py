"""Resolving ``"module:function"`` specs (judges, reward functions) to the callables they name, and dotted
class paths (a config's ``class_path``) to their classes (:func:`import_class`).

One place for the rules and the messages: the spec must have the form ``module:attr[.attr]``, a
module named by the spec that does not exist is the spec's fault (a ``ValueError`` naming it),
while a missing dependency inside an existing module is reported as itself.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable


def import_class(class_path: str) -> type | None:
    """The class a dotted path names, or None."""
    module_name, _, name = str(class_path).rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        return None
    return found if inspect.isclass(found) else None


def resolve_callable(spec: str, what: str, example: str) -> Callable:
    """The callable a ``"module:attr.attr"`` spec names, or a ``ValueError`` naming the spec.

    Args:
        spec: e.g. ``"rlhf_lit.evaluation.judges:vader"``.
        what: the kind of spec, for messages (``"judge spec"``, ``"reward function spec"``).
        example: a valid spec of that kind, shown when the form is wrong.
    """
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise ValueError(f"{what} {spec!r} is not of the form 'module:function' (for example {example!r})")
    try:
        obj = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        # Only a missing module named by the spec is the spec's fault; a missing dependency inside it is not.
        if e.name is None or not module_name.startswith(e.name):
            raise
        raise ValueError(f"{what} {spec!r}: no module named {module_name!r}") from e
    for attr in attr_path.split("."):
        if not hasattr(obj, attr):
            raise ValueError(f"{what} {spec!r}: {module_name!r} has no attribute {attr_path!r}")
        obj = getattr(obj, attr)
    if not callable(obj):
        raise ValueError(f"{what} {spec!r}: {attr_path!r} is not callable (type {type(obj).__name__})")
    return obj

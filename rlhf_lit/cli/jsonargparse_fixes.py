"""Two adjustments to jsonargparse, so every value a config file can hold can be typed and read.

- **Nested options keep their value.** ``--model.init_args.reward.missing_eos_penalty null`` is first
  parsed by jsonargparse (``null`` -> ``None``) and then handed to the stage's own parser as text
  made with ``str(value)``: ``None`` became the string ``"None"``, which no ``float | None`` accepts
  (and ``[{function: null}]`` lost its null the same way). :func:`pass_nested_values_as_yaml` gives
  that parser YAML text instead (``null``, ``1.0e-05``, ``{a: null}``), which it reads back as the
  value itself. Text the user typed is passed on unchanged.
- **A YAML syntax error names its file.** jsonargparse reports ``Problems parsing config: while
  parsing a flow sequence in "<unicode string>", line 2, column 14``. :func:`name_yaml_errors`
  installs (through jsonargparse's public ``set_loader``) a loader that raises the same error with
  the file, line and column: ``configs/x.yaml, line 3, column 1: did not find expected ',' or ']'
  (while parsing a flow sequence that starts at line 2, column 14)``.

:func:`install` applies both, once; ``rlhf_lit.cli`` calls it on import.
"""

from __future__ import annotations

import math
from typing import Any

import yaml
from jsonargparse import (
    Namespace,
    _typehints,  # the nested-option path has no public hook
    set_loader,
)

_NestedArg = getattr(_typehints, "NestedArg", None)


def option_text(value: Any) -> str:
    """YAML text that jsonargparse's loader reads back as ``value`` (``None`` -> ``null``, ``1e-05`` -> ``1.0e-05``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    try:
        text = yaml.safe_dump(value, default_flow_style=True, width=math.inf, sort_keys=False, allow_unicode=True)
    except yaml.YAMLError:  # not a YAML value: jsonargparse's own text
        return str(value)
    return text.strip().removesuffix("...").strip()  # a plain scalar ends its document with "..."


def pass_nested_values_as_yaml() -> None:
    """Wrap jsonargparse's ``adapt_class_type`` so a parsed nested option reaches the class's parser as YAML."""
    original = getattr(_typehints, "adapt_class_type", None)
    if original is None or _NestedArg is None or getattr(original, "_rlhf_lit", False):
        return  # another jsonargparse: tests/cli/test_option_errors.py says whether it still needs this

    def adapt_class_type(value, *args, **kwargs):
        init_args = value.get("init_args") if isinstance(value, (dict, Namespace)) else None
        if isinstance(init_args, _NestedArg) and not isinstance(init_args.val, str):
            value["init_args"] = _NestedArg(key=init_args.key, val=option_text(init_args.val))
        return original(value, *args, **kwargs)

    adapt_class_type._rlhf_lit = True  # type: ignore[attr-defined]
    _typehints.adapt_class_type = adapt_class_type


class ConfigSyntaxError(yaml.YAMLError):
    """A config file that is not valid YAML, with its file, line and column in the message."""


def _position(mark) -> tuple[int, int] | None:
    """A YAML mark's (line, column), 0-based."""
    return (mark.line, mark.column) if mark is not None else None


def yaml_error_text(error: yaml.YAMLError, path: str) -> str:
    """``path, line L, column C: <problem> (while <context> that starts at line L', column C')``."""
    mark = getattr(error, "problem_mark", None)
    where = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark else str(path)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    context, context_mark = getattr(error, "context", None), getattr(error, "context_mark", None)
    if context and context_mark is not None and _position(context_mark) != _position(mark):
        problem += f" ({context} that starts at line {context_mark.line + 1}, column {context_mark.column + 1})"
    elif context:
        problem += f" ({context})"
    return f"{where}: {problem}"


def name_yaml_errors() -> None:
    """Load YAML as jsonargparse does, naming the file, line and column of a syntax error in a config file."""
    try:
        from jsonargparse._loaders_dumpers import yaml_load  # jsonargparse's own YAML reading, kept as it is
    except ImportError:  # another jsonargparse: its own messages stay (tests/cli/test_option_errors.py tells)
        return

    def load_yaml(value: str, path: str = "") -> Any:
        try:
            return yaml_load(value)
        except yaml.YAMLError as error:
            if not path:  # a command-line value: jsonargparse keeps text that is not YAML as a string
                raise
            raise ConfigSyntaxError(yaml_error_text(error, str(path))) from error

    set_loader("yaml", load_yaml, exceptions=(yaml.YAMLError,))


_installed = False


def install() -> None:
    """Apply both adjustments (once per process)."""
    global _installed
    if not _installed:
        pass_nested_values_as_yaml()
        name_yaml_errors()
        _installed = True

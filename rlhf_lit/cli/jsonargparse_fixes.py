"""Adjustments to jsonargparse, so every value a config file can hold can be typed and read, and every
mistake in a config file is told with its file, line and key.

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
- **A config file that is no mapping of keys is named.** :func:`check_config_files` refuses, naming the
  file (and line), one that is not UTF-8 (a bare codec error before), holds nothing, a list or a plain
  value ("Unexpected config: - a"), or writes a key twice in one mapping (the later one won, silently):
  :func:`rlhf_lit.cli.config_checks.config_text_problem`.
- **A group of options takes only a mapping.** A dataclass group (``optimizer``, ``ppo``) or ``trainer``
  given a number, a list or null was accepted and crashed the stage's build; a stage's ``init_args`` given
  one was reported as an unknown class. :func:`check_group_values` refuses them where jsonargparse checks
  the key, so the report names it and the config line; a group's options given as a file that is not YAML
  or not UTF-8 name that file.

:func:`install` applies them, once; ``rlhf_lit.cli`` calls it on import.
"""

from __future__ import annotations

import math
import os
from argparse import ArgumentError
from contextvars import ContextVar
from typing import Any

import yaml
from jsonargparse import (
    ArgumentParser,
    Namespace,
    _actions,  # the group and config-file paths have no public hooks
    _typehints,  # the nested-option path has no public hook
    set_loader,
)
from jsonargparse import Path as ConfigPath

from rlhf_lit.cli.config_checks import config_text_problem, group_name, group_value_problem
from rlhf_lit.config_files import not_utf8_text

_NestedArg = getattr(_typehints, "NestedArg", None)
_ActionConfigLoad = getattr(_actions, "_ActionConfigLoad", None)
_NOT_A_MAPPING = (bool, int, float, list, tuple, type(None))


def _not_a_mapping(value: Any) -> bool:
    """A value a group of options can never be given as (a string may name a file of them; jsonargparse's
    ``NestedArg``, one option below the group, is a tuple)."""
    return isinstance(value, _NOT_A_MAPPING) and not (_NestedArg is not None and isinstance(value, _NestedArg))


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
        if init_args is not None and _not_a_mapping(init_args):  # None: no init_args given
            # jsonargparse reads it as a mapping ("'int' object has no attribute 'keys'", told as an
            # unknown class); an ArgumentError is reported under the class's key as a wrong value
            class_path = value.get("class_path") or ""
            owner = group_name(str(class_path).rsplit(".", 1)[-1] or None)
            raise ArgumentError(None, f"Expected a mapping of {owner} options. Got value: {init_args}")
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


_config_file: ContextVar[str | None] = ContextVar("rlhf_lit_config_file", default=None)
"""The ``--config`` file being read, as given (jsonargparse hands its reader the base name only)."""


def check_config_files() -> None:
    """Refuse a ``--config`` file that is not UTF-8, holds no mapping, or writes a key twice, naming it.

    Raised as jsonargparse's own "Problems parsing config: ..." so the parser reports it like a YAML
    syntax error (:func:`rlhf_lit.cli.parser_errors.condense_parser_error`).
    """
    original_parse_path = ArgumentParser.parse_path
    original_load = getattr(ArgumentParser, "_load_config_parser_mode", None)
    if original_load is None or getattr(original_parse_path, "_rlhf_lit", False):
        return  # another jsonargparse: its own messages stay (tests/cli/test_config_file_errors.py tells)

    def parse_path(self, path, *args, **kwargs):
        token = _config_file.set(str(path))
        try:
            return original_parse_path(self, path, *args, **kwargs)
        except UnicodeDecodeError as error:  # read before any YAML: a codec error naming no file
            raise TypeError(f"Problems parsing config: {not_utf8_text(error, str(path))}") from None
        finally:
            _config_file.reset(token)

    def load_config_parser_mode(self, content, path="", *args, **kwargs):
        given = _config_file.get()
        if path and self.parser_mode == "yaml":  # a file's text, not a --config given as YAML text
            shown = given if given and os.path.basename(given) == str(path) else str(path)
            problem = config_text_problem(content, shown)
            if problem:
                raise TypeError(f"Problems parsing config: {problem}")
        return original_load(self, content, path, *args, **kwargs)

    parse_path._rlhf_lit = True  # type: ignore[attr-defined]
    ArgumentParser.parse_path = parse_path
    ArgumentParser._load_config_parser_mode = load_config_parser_mode


def check_group_values() -> None:
    """Refuse a group of options (a dataclass's, ``trainer``) given something else than a mapping or a file of one.

    jsonargparse checks only a string given to a group (a file or YAML text); a number, list or null
    passed, and reached the stage's constructor. The refusal is worded as jsonargparse's type errors
    (:func:`rlhf_lit.cli.config_checks.group_value_problem`), so the report names the key and its line.
    """
    original_check = getattr(ArgumentParser, "_check_value_key", None)
    original_load = getattr(_ActionConfigLoad, "_load_config", None)
    if original_check is None or original_load is None or getattr(original_check, "_rlhf_lit", False):
        return  # another jsonargparse: its own messages stay (tests/cli/test_config_file_errors.py tells)

    def check_value_key(self, action, value, key, *args, **kwargs):
        if isinstance(action, _ActionConfigLoad) and _not_a_mapping(value):
            raise TypeError(group_value_problem(key, value, getattr(action, "basetype", None)))
        return original_check(self, action, value, key, *args, **kwargs)

    def load_config(self, value, parser):
        try:
            return original_load(self, value, parser)
        except UnicodeDecodeError as error:  # a file of the group's options, not UTF-8
            raise TypeError(f'Parser key "{self.dest}": {not_utf8_text(error, str(value))}') from None
        except TypeError as error:
            if not str(error).startswith(f'Parser key "{self.dest}":\nUnable to load config'):
                raise
            try:  # a file (relative to the config that names it, as jsonargparse reads it)
                ConfigPath(value, mode="fr")
                is_file = isinstance(value, str)
            except TypeError:
                is_file = False
            if is_file and isinstance(error.__cause__, yaml.YAMLError):
                raise TypeError(f'Parser key "{self.dest}": {yaml_error_text(error.__cause__, value)}') from None
            shown = f"{value}, a file that holds no mapping" if is_file else value
            raise TypeError(group_value_problem(self.dest, shown, self.basetype)) from None

    check_value_key._rlhf_lit = True  # type: ignore[attr-defined]
    ArgumentParser._check_value_key = check_value_key
    _ActionConfigLoad._load_config = load_config


_installed = False


def install() -> None:
    """Apply the adjustments (once per process)."""
    global _installed
    if not _installed:
        pass_nested_values_as_yaml()
        name_yaml_errors()
        check_config_files()
        check_group_values()
        _installed = True

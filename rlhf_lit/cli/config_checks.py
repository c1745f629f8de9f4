"""What a config file's text or a group's value must be, told in words that name the file, line and key.

jsonargparse reads a ``--config`` file and checks its keys, but some mistakes pass it or come back
without the file's name: bytes that are not UTF-8 (a codec error), a file that holds a list, a plain
value or nothing ("Unexpected config: - a"), a key written twice in one mapping (the later one wins,
silently), and a group of options (``optimizer``, ``trainer``) given a number or a list instead of a
mapping (accepted, then a crash when the stage is built). These functions say what is wrong (bytes that
are not UTF-8: :func:`rlhf_lit.config_files.not_utf8_text`); :mod:`rlhf_lit.cli.jsonargparse_fixes` calls
them where jsonargparse reads and checks.
"""

from __future__ import annotations

from typing import Any

import yaml

CONFIG_SHAPE = "a config file is a mapping of keys (trainer:, model:, data:, ...)"


def _duplicate_key(node: yaml.Node, key: list[str]) -> str | None:
    """The first key written twice in one mapping under ``node``: ``line N: <key path> ... (first at line M)``."""
    if isinstance(node, yaml.MappingNode):
        first_lines: dict[str, int] = {}
        for key_node, child in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.value == "<<":  # merge keys may repeat
                found = _duplicate_key(child, key)
            else:
                name, line = key_node.value, key_node.start_mark.line + 1
                if name in first_lines:
                    where = ".".join([*key, name])
                    return (
                        f"line {line}: {where} given twice in one mapping (first at line {first_lines[name]}); keep one"
                    )
                first_lines[name] = line
                found = _duplicate_key(child, [*key, name])
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for i, child in enumerate(node.value):
            found = _duplicate_key(child, [*key[:-1], f"{key[-1]}[{i}]"] if key else [f"[{i}]"])
            if found:
                return found
    return None


def config_text_problem(text: str, path: str) -> str | None:
    """What is wrong with a config file's text as a whole, naming ``path`` (and the line), or None.

    A file that holds no mapping (nothing, only comments, a list, a plain value) or writes a key twice
    in one mapping. Text that is not YAML is left to the YAML reader, whose error names the line and column.
    """
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    if root is None:
        return f"{path}: no settings in it (the file is empty or holds only comments); {CONFIG_SHAPE}"
    if not isinstance(root, yaml.MappingNode):
        held = "a list" if isinstance(root, yaml.SequenceNode) else f"a plain value ({root.value!r})"
        return f"{path}, line {root.start_mark.line + 1}: the file holds {held}; {CONFIG_SHAPE}"
    duplicate = _duplicate_key(root, [])
    return f"{path}, {duplicate}" if duplicate else None


def group_name(owner: Any) -> str:
    """Whose options a group holds, for a message: ``OptimizerConfig's`` for the class or its name (``its``
    when not known)."""
    name = owner if isinstance(owner, str) else getattr(owner, "__name__", None)
    return f"{name}'s" if name else "its"


def group_value_problem(dest: str, value: Any, basetype: Any) -> str:
    """jsonargparse's words for a group of options (``optimizer``) given something else than a mapping:
    ``Parser key "optimizer": Expected a mapping of OptimizerConfig's options. Got value: 5``, the shape
    :mod:`rlhf_lit.cli.parser_errors` reads as a wrong value of that key."""
    shown = "null" if value is None else value
    return f'Parser key "{dest}": Expected a mapping of {group_name(basetype)} options. Got value: {shown}'

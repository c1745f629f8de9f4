"""Reading a YAML config file outside the CLI's parser: the one reader (``rlhf-lit iterate``'s loop config,
the stage class a ``fit`` config names, the data section a prompt source reads from a ``fit`` config).

``rlhf-lit fit`` itself parses its configs with jsonargparse (:mod:`rlhf_lit.cli`); the commands and the
data package read one only to learn what it says, with this function, whose errors name the file and line.
"""

from __future__ import annotations

import os
from typing import Any


def not_utf8_text(error: UnicodeDecodeError, path: str) -> str:
    """``<path>, line L, column C: not UTF-8 text (byte 0xe9); ...``: where the first undecodable byte is."""
    read = bytes(error.object[: error.start])
    line = read.count(b"\n") + 1
    column = len(read) - (read.rfind(b"\n") + 1) + 1
    byte = bytes(error.object[error.start : error.start + 1]).hex()
    return f"{path}, line {line}, column {column}: not UTF-8 text (byte 0x{byte}); save the file as UTF-8"


def read_yaml_mapping(path: str) -> dict[str, Any]:
    """The mapping a YAML file holds (an empty file: ``{}``).

    Raises:
        FileNotFoundError: naming the file when there is none.
        ValueError: ``<path> line N: not YAML (<the parser's words>)``, ``<path>: not a YAML mapping``
            when the file holds something else (a list, a string), or ``<path>, line N, column C: not UTF-8
            text ...`` (:func:`not_utf8_text`).
    """
    import yaml

    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file")
    try:
        with open(path, "rb") as f:  # decoded whole, so a bad byte's line is counted in the file, not a chunk
            values = yaml.safe_load(f.read().decode("utf-8"))
    except UnicodeDecodeError as error:  # the codec's own words name no file
        raise ValueError(not_utf8_text(error, path)) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise ValueError(f"{path}{line}: not YAML ({getattr(error, 'problem', None) or error})") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ValueError(f"{path}: not a YAML mapping (it holds a {type(values).__name__})")
    return values

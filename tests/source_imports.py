"""What a source file imports, read with ``ast`` (nothing is imported): for the import-rule tests."""

from __future__ import annotations

import ast
from pathlib import Path


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (function-level imports included); absolute imports only."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def under(names: set[str], prefixes: tuple[str, ...]) -> list[str]:
    """The ``names`` that are one of ``prefixes`` or inside one, sorted."""
    return sorted(n for n in names if any(n == p or n.startswith(p + ".") for p in prefixes))

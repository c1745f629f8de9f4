"""The library below the CLI imports no layer above it (read from the source, nothing is imported).

The evaluation library never imports the commands or the CLI (``rlhf-lit evaluate`` is a shell
around :mod:`rlhf_lit.evaluation`, not the other way round), nor the demo (``demo/`` beside the
package uses the library: tests/demo/test_demo_imports.py); ``sources`` and ``artifacts``
sit at the bottom beside ``functional`` and import nothing of rlhf-lit's above them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "rlhf_lit"


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (function-level imports included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _under(names: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if any(n == p or n.startswith(p + ".") for p in prefixes))


def test_the_evaluation_library_never_imports_the_commands_or_the_cli():
    for path in sorted((PACKAGE / "evaluation").glob("*.py")):
        assert _under(_imports(path), ("rlhf_lit.commands", "rlhf_lit.cli")) == [], path


def test_the_evaluation_library_imports_no_stage_callback_or_demo():
    for path in sorted((PACKAGE / "evaluation").glob("*.py")):
        assert _under(_imports(path), ("rlhf_lit.stages", "rlhf_lit.callbacks", "demo")) == [], path


@pytest.mark.parametrize("module, allowed", [("sources.py", {"rlhf_lit.artifacts", "rlhf_lit.integrity"}), ("artifacts.py", set()),
                                             ("integrity.py", set())])
def test_bottom_modules_import_nothing_above_them(module, allowed):
    ours = {n for n in _imports(PACKAGE / module) if n == "rlhf_lit" or n.startswith("rlhf_lit.")}
    assert ours <= allowed, ours - allowed

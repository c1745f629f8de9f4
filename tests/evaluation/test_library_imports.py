"""The library below the CLI imports no layer above it (read from the source, nothing is imported).

The evaluation library never imports the commands or the CLI (``rlhf-lit evaluate`` is a shell
around :mod:`rlhf_lit.evaluation`, not the other way round), nor the demo (``demo/`` beside the
package uses the library: tests/demo/test_demo_imports.py); ``sources`` and ``artifacts``
sit at the bottom beside ``functional`` and import nothing of rlhf-lit's above them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from source_imports import imports_of, under

PACKAGE = Path(__file__).resolve().parents[2] / "rlhf_lit"


def test_the_evaluation_library_never_imports_the_commands_or_the_cli():
    for path in sorted((PACKAGE / "evaluation").glob("*.py")):
        assert under(imports_of(path), ("rlhf_lit.commands", "rlhf_lit.cli")) == [], path


def test_the_evaluation_library_imports_no_stage_callback_or_demo():
    for path in sorted((PACKAGE / "evaluation").glob("*.py")):
        assert under(imports_of(path), ("rlhf_lit.stages", "rlhf_lit.callbacks", "demo")) == [], path


@pytest.mark.parametrize(
    "module, allowed",
    [("sources.py", {"rlhf_lit.artifacts", "rlhf_lit.integrity"}), ("artifacts.py", set()), ("integrity.py", set())],
)
def test_bottom_modules_import_nothing_above_them(module, allowed):
    ours = {n for n in imports_of(PACKAGE / module) if n == "rlhf_lit" or n.startswith("rlhf_lit.")}
    assert ours <= allowed, ours - allowed

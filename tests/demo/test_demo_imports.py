"""The demo sits beside the library, not in it: it uses library modules and runs ``rlhf-lit`` as a
user does; the library neither imports nor names it, and the wheel does not ship it (read from the
source, nothing is imported)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
from source_imports import imports_of, under

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "demo"
PACKAGE = ROOT / "rlhf_lit"


@pytest.mark.parametrize("path", sorted(DEMO.glob("*.py")), ids=lambda p: p.name)
def test_the_demo_imports_no_stage_callback_command_or_cli(path):
    forbidden = ("rlhf_lit.stages", "rlhf_lit.callbacks", "rlhf_lit.strategies", "rlhf_lit.commands", "rlhf_lit.cli")
    assert under(imports_of(path), forbidden) == []


def test_the_library_neither_imports_nor_names_the_demo():
    modules = "|".join(sorted(p.stem for p in DEMO.glob("*.py") if not p.stem.startswith("_")))
    named = re.compile(rf"rlhf_lit[./]demo\b|python -m demo\b|\bdemo\.({modules})\b")
    for path in sorted(PACKAGE.rglob("*.py")):
        assert under(imports_of(path), ("demo",)) == [], path
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if named.search(line)]
        assert lines == [], f"{path} points at the demo; describe the library code instead: {lines}"
    assert not (PACKAGE / "demo").exists()


def test_the_wheel_ships_no_demo():
    from setuptools import find_packages

    with open(ROOT / "pyproject.toml", "rb") as f:
        find = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]
    packages = find_packages(str(ROOT), include=find["include"], exclude=find.get("exclude", ()))
    assert "rlhf_lit" in packages and not [p for p in packages if p == "demo" or p.startswith("demo.")]

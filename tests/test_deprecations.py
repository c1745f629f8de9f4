"""Every deprecation note names the release that removes what it deprecates, a release after this one.

A note is any text that says "deprecated": a docstring, comment or call argument (a warning's
message, an option's help) of the package, or a paragraph of the user docs (README.md, docs/*.md);
and the message of every ``DeprecationWarning`` (or ``FutureWarning``) the package raises.
Beside each "deprecated" it must say "removed in X.Y.Z" with X.Y.Z above ``rlhf_lit.__version__``;
once that release is cut, the note fails here until the deprecated name is gone.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest
from assets_paths import ROOT

import rlhf_lit

DEPRECATED = re.compile(r"\bdeprecated\b", re.IGNORECASE)
REMOVED_IN = re.compile(r"\bremoved in (\d+)\.(\d+)\.(\d+)\b")
DEPRECATION_WARNINGS = {"DeprecationWarning", "PendingDeprecationWarning", "FutureWarning"}
NEAR = 150
"""How far from its "deprecated" a note's release may stand: the same sentence, not the same page."""


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _comment_blocks(source: str) -> Iterator[tuple[int, str]]:
    """``(first line, text)`` of each run of comment lines that follow one another."""
    block: list[str] = []
    start = last = 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        line = tok.start[0]
        if block and line != last + 1:
            yield start, " ".join(block)
            block = []
        if not block:
            start = line
        block.append(tok.string.lstrip("# "))
        last = line
    if block:
        yield start, " ".join(block)


def _python_texts(source: str) -> Iterator[tuple[int, str]]:
    """``(line, text)`` of every docstring (a string statement), comment block and string argument of a call."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            yield node.lineno, node.value.value
        elif isinstance(node, ast.Call):
            args = [*node.args, *(k.value for k in node.keywords)]
            # A deprecation warning's message is a note whatever its words.
            warns = any(isinstance(a, ast.Name) and a.id in DEPRECATION_WARNINGS for a in args)
            for arg in args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    yield arg.lineno, f"deprecated: {arg.value}" if warns else arg.value
    yield from _comment_blocks(source)


def _markdown_paragraphs(text: str) -> Iterator[tuple[int, str]]:
    """``(first line, text)`` of each blank-line-separated paragraph (a table row is its own)."""
    start, lines = 1, []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("|"):
            if lines:
                yield start, " ".join(lines)
            lines = []
            if line.strip():
                yield number, line
            continue
        if not lines:
            start = number
        lines.append(line)
    if lines:
        yield start, " ".join(lines)


def notes(root: Path = ROOT) -> list[tuple[str, str]]:
    """``(place, text)`` of every deprecation note in the package and the user docs."""
    found = []
    for path in sorted((root / "rlhf_lit").rglob("*.py")):
        for line, text in _python_texts(path.read_text(encoding="utf-8")):
            found.append((f"{path.relative_to(root)}:{line}", text))
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for line, text in _markdown_paragraphs(path.read_text(encoding="utf-8")):
            found.append((f"{path.relative_to(root)}:{line}", text))
    return [(place, text) for place, text in found if DEPRECATED.search(text)]


def names_a_later_removal(text: str, current: tuple[int, ...]) -> bool:
    """Whether each "deprecated" of ``text`` has a "removed in X.Y.Z" within :data:`NEAR` characters
    (whitespace collapsed), and every such release is after ``current``."""
    text = " ".join(text.split())
    versions = [tuple(int(g) for g in m.groups()) for m in REMOVED_IN.finditer(text)]
    near = all(REMOVED_IN.search(text[max(0, m.start() - NEAR) : m.end() + NEAR]) for m in DEPRECATED.finditer(text))
    return near and bool(versions) and all(v > current for v in versions)


def test_every_deprecation_note_names_a_later_release_that_removes_it():
    current = _version(rlhf_lit.__version__)
    found = notes()
    assert len(found) >= 5, found  # the aliases and the shim are noted where defined, read and documented
    bad = [
        f"{place}: {' '.join(text.split())[:160]}" for place, text in found if not names_a_later_removal(text, current)
    ]
    assert not bad, (
        f"each deprecation note must say 'removed in X.Y.Z', a release after {rlhf_lit.__version__} "
        "(or the deprecated name must go):\n" + "\n".join(bad)
    )


def test_notes_are_found_in_docstrings_comments_call_arguments_and_paragraphs(tmp_path):
    (tmp_path / "rlhf_lit").mkdir()
    (tmp_path / "docs").mkdir()
    note, other = "Deprecated: the old name.", "removed in 0.3.0, but no note"
    (tmp_path / "README.md").write_text(f"# x\n\n{other}\n\n| a | {note} |\n\nsome\n{note}\n")
    (tmp_path / "rlhf_lit" / "m.py").write_text(
        f'"""{note}"""\n\n# {other}\n# {note}\nwarn({note!r})\nX = {note!r}\nwarn({other!r}, DeprecationWarning)\n'
    )
    places = sorted(place for place, _ in notes(tmp_path))
    assert places == [
        "README.md:5",
        "README.md:7",
        "rlhf_lit/m.py:1",
        "rlhf_lit/m.py:3",
        "rlhf_lit/m.py:5",
        "rlhf_lit/m.py:7",
    ]


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("Deprecated, removed in 0.3.0: the old name.", True),
        ("Deprecated: the old name.", False),  # no release named
        ("deprecated alias, removed in 0.2.0", False),  # the current release
        ("deprecated alias, removed in 0.1.9", False),  # an earlier one
        ("deprecated, removed in 0.3.0 (and its alias, removed in 0.2.0)", False),
        ("deprecated, removed in 1.0.0", True),
        ("Deprecated, removed in 0.3.0: x. " + "y " * 100 + "Another deprecated name.", False),  # too far
    ],
)
def test_a_note_must_name_a_release_after_the_current_one(text, ok):
    assert names_a_later_removal(text, (0, 2, 0)) == ok

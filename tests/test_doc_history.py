"""The user docs and the package say what is true now; history goes to CHANGELOG.md and bench/results/.

README.md, docs/ and the package's sources cite no issue numbers and tell no commit narratives ("at
abc1234", "since abc1234"), and the user docs name no commits: a measured figure states its
provenance as the date, the machine and the command that reproduces it (docs/development.md,
"Writing the docs").
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from assets_paths import ROOT

ISSUE_OR_COMMIT_STORY = re.compile(
    r"\b[Ii]ssue #?[0-9]+|#[0-9]{2}\b|\b([Aa]t|[Ss]ince|[Bb]efore|[Aa]fter|[Uu]ntil) (commit )?[0-9a-f]{7}\b"
)
"""An issue number ("issue 39", "#37") or a commit told as history ("at fea7aae", "since commit f2cab41")."""
COMMIT = re.compile(r"\bcommit [0-9a-f]{7,40}\b|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
"""A commit hash: "commit" and 7 to 40 hex digits, or such digits with at least one letter and one
digit (a date or a byte count has no letter, a word no digit)."""


def _user_docs(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def _hits(pattern: re.Pattern, paths: list[Path], root: Path) -> list[str]:
    return [
        f"{path.relative_to(root)}:{number}: {line.strip()[:140]}"
        for path in paths
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]


def history_in(root: Path = ROOT) -> list[str]:
    """Lines of the user docs and the package that cite an issue or tell a commit's story."""
    return _hits(ISSUE_OR_COMMIT_STORY, [*_user_docs(root), *sorted((root / "rlhf_lit").rglob("*.py"))], root)


def commits_in(root: Path = ROOT) -> list[str]:
    """Lines of the user docs that name a commit."""
    return _hits(COMMIT, _user_docs(root), root)


def test_no_issue_numbers_or_commit_stories_in_the_user_docs_and_the_package():
    found = history_in()
    assert not found, "history belongs in CHANGELOG.md or bench/results/:\n" + "\n".join(found)


def test_the_user_docs_name_no_commits():
    found = commits_in()
    assert not found, "state a figure's provenance as date, machine and command:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("line", "history", "commit"),
    [
        ("Measured at commit f2cab41 on a 2-core CPU.", True, True),
        ("the same command took 23 min at 81a0daf", True, True),
        ("Since 49a95e1 three compiles are gone.", True, True),
        ("Until commit 589c859 the objective fell.", True, True),
        ("(docs/DEMO.md, issue 39)", True, False),
        ("written before #37 unified the vocabulary", True, False),
        ("Measured on 2026-11-25, 2-core AMD EPYC, `make demo`.", False, False),
        ("`bench/results/recipe-smollm2-20261126.json`, 1591362 bytes", False, False),
        ("a fresh clone (commit 93df8da)", False, True),
        ("measured on 2026-11-22 (commit 2166731)", False, True),
        ("N detail 12 (GAE lambda 0.95), deadbeef, fp16, bf16-mixed", False, False),
    ],
)
def test_what_counts_as_history_and_as_a_commit(tmp_path, line, history, commit):
    (tmp_path / "docs").mkdir()
    (tmp_path / "rlhf_lit").mkdir()
    (tmp_path / "README.md").write_text("# x\n")
    (tmp_path / "docs" / "page.md").write_text(f"# page\n\n{line}\n")
    (tmp_path / "rlhf_lit" / "m.py").write_text(f"# {line}\n")
    assert bool(history_in(tmp_path)) == history
    if history:
        assert history_in(tmp_path) == [f"docs/page.md:3: {line}", f"rlhf_lit/m.py:1: # {line}"]
    assert commits_in(tmp_path) == ([f"docs/page.md:3: {line}"] if commit else [])

"""rlhf_lit.artifacts: atomic writes, and never replacing or clearing what rlhf-lit did not write.

Expected states and contents are written out by hand; the module is standard library only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from suite_env import subprocess_env

from rlhf_lit.artifacts import (
    NotOwned,
    TargetChanged,
    claim_directory,
    clear_owned_entries,
    directory_state,
    json_file_state,
    remove_owned_directory,
    replace_path,
    write_bytes_atomically,
    write_directory_atomically,
    write_json_atomically,
    write_text_atomically,
)

MARK = ".ours"


def _tree(path: Path) -> dict[str, str]:
    """Every file under ``path`` (relative name -> text): what a directory holds, for comparisons."""
    return {str(p.relative_to(path)): p.read_text() for p in sorted(path.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------- files
def test_atomic_file_write_leaves_the_old_file_when_the_write_fails(tmp_path, monkeypatch):
    target = tmp_path / "result.json"
    target.write_text("old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        write_text_atomically(target, "new")
    assert target.read_text() == "old"  # never half written
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]  # the temporary file is gone


def test_atomic_file_write_replaces_whole_and_creates_the_parent(tmp_path):
    target = tmp_path / "sub" / "result.txt"
    write_bytes_atomically(target, b"first")
    write_text_atomically(target, "second")
    assert target.read_text() == "second"
    assert [p.name for p in target.parent.iterdir()] == ["result.txt"]


def test_atomic_file_write_gives_the_permissions_of_a_plain_open(tmp_path):
    plain, atomic = tmp_path / "plain", tmp_path / "atomic"
    plain.write_text("x")
    write_text_atomically(atomic, "x")
    assert (atomic.stat().st_mode & 0o777) == (plain.stat().st_mode & 0o777)


def test_json_is_written_with_indent_1_non_ascii_kept_and_a_final_line_break(tmp_path):
    write_json_atomically(tmp_path / "r.json", {"written_by": "rlhf-lit evaluate", "text": "café"})
    assert (tmp_path / "r.json").read_text(encoding="utf-8") == (
        '{\n "written_by": "rlhf-lit evaluate",\n "text": "café"\n}\n'
    )


def test_json_file_state_by_written_by(tmp_path):
    ours, theirs, broken, listing = (tmp_path / n for n in ("ours.json", "theirs.json", "broken.json", "list.json"))
    ours.write_text('{"written_by": "rlhf-lit best-of-n"}')
    theirs.write_text('{"written_by": "someone else"}')
    broken.write_text("{not json")
    listing.write_text("[1, 2]")
    assert json_file_state(ours, "rlhf-lit ") == "owned"
    assert json_file_state(theirs, "rlhf-lit ") == "foreign"
    assert json_file_state(broken, "rlhf-lit ") == "foreign"
    assert json_file_state(listing, "rlhf-lit ") == "foreign"
    assert json_file_state(tmp_path / "missing.json", "rlhf-lit ") == "absent"
    assert json_file_state(tmp_path, "rlhf-lit ") == "directory"


# ------------------------------------------------------------------------------- directories
def test_directory_state(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "ours").mkdir()
    (tmp_path / "ours" / MARK).write_text("")
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "thesis.tex").write_text("years of work")
    (tmp_path / "file").write_text("")
    (tmp_path / "link").symlink_to(tmp_path / "ours")
    assert directory_state(tmp_path / "missing", MARK) == "absent"
    assert directory_state(tmp_path / "empty", MARK) == "empty"
    assert directory_state(tmp_path / "ours", MARK) == "owned"
    assert directory_state(tmp_path / "theirs", MARK) == "foreign"
    assert directory_state(tmp_path / "file", MARK) == "not_a_directory"
    assert directory_state(tmp_path / "link", MARK) == "not_a_directory"  # a swap would replace the link
    assert directory_state(tmp_path / "link", MARK, follow_symlinks=True) == "owned"


def _fill(name: str, text: str):
    def fill(tmp: Path) -> None:
        (tmp / name).write_text(text)

    return fill


def test_directory_write_puts_the_contents_and_the_marker_in_place_and_nothing_beside(tmp_path):
    target = tmp_path / "export"
    assert write_directory_atomically(target, _fill("weights", "v1"), MARK, "about v1") == target
    assert _tree(target) == {"weights": "v1", MARK: "about v1"}
    # replacing an owned directory: the new one whole, the old one gone, nothing left beside it
    write_directory_atomically(target, _fill("model", "v2"), MARK, lambda: "about v2")
    assert _tree(target) == {"model": "v2", MARK: "about v2"}
    assert [p.name for p in tmp_path.iterdir()] == ["export"]


def test_directory_write_that_fails_leaves_the_old_directory_untouched(tmp_path):
    target = tmp_path / "export"
    write_directory_atomically(target, _fill("weights", "v1"), MARK, "about v1")

    def half_then_crash(tmp: Path) -> None:
        (tmp / "weights").write_text("half")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError, match="killed mid-write"):
        write_directory_atomically(target, half_then_crash, MARK, "about v2")
    assert _tree(target) == {"weights": "v1", MARK: "about v1"}
    assert [p.name for p in tmp_path.iterdir()] == ["export"]


def test_directory_write_puts_the_old_one_back_when_the_rename_fails(tmp_path, monkeypatch):
    target = tmp_path / "export"
    write_directory_atomically(target, _fill("weights", "v1"), MARK, "about v1")
    real_replace = os.replace

    def refuse_the_new_one(src, dst):
        if Path(src).name.startswith(".export.tmp-"):  # the new directory's rename into place
            raise OSError("rename failed")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", refuse_the_new_one)
    with pytest.raises(OSError, match="rename failed"):
        write_directory_atomically(target, _fill("weights", "v2"), MARK, "about v2")
    assert _tree(target) == {"weights": "v1", MARK: "about v1"}
    assert [p.name for p in tmp_path.iterdir()] == ["export"]


def test_directory_write_never_replaces_a_foreign_directory(tmp_path):
    # The caller checks first; if the directory still holds foreign files, it is put back as it was.
    target = tmp_path / "mine"
    target.mkdir()
    (target / "thesis.tex").write_text("years of work")
    with pytest.raises(TargetChanged):
        write_directory_atomically(target, _fill("weights", "v1"), MARK, "about")
    assert _tree(target) == {"thesis.tex": "years of work"}
    assert [p.name for p in tmp_path.iterdir()] == ["mine"]


def test_claim_directory_marks_once_and_keeps_an_existing_marker(tmp_path):
    out = tmp_path / "a" / "out"
    assert claim_directory(out, MARK, "first") is True
    assert (out / MARK).read_text() == "first"
    assert claim_directory(out, MARK, "second") is False
    assert (out / MARK).read_text() == "first"


def test_clearing_refuses_without_the_marker_and_removes_only_the_named_entries(tmp_path):
    root = tmp_path / "out"
    root.mkdir()
    for name in ("sft", "ppo"):
        (root / name).mkdir()
        (root / name / "f").write_text(name)
    (root / "results.json").write_text("{}")
    (root / "mine.txt").write_text("keep")
    with pytest.raises(NotOwned):
        clear_owned_entries(root, MARK, ["sft", "ppo", "results.json"])
    assert sorted(p.name for p in root.iterdir()) == ["mine.txt", "ppo", "results.json", "sft"]  # nothing removed
    (root / MARK).write_text("")
    clear_owned_entries(root, MARK, ["sft", "ppo", "results.json", "absent"])
    assert sorted(p.name for p in root.iterdir()) == [MARK, "mine.txt"]


def test_removing_a_directory_needs_its_marker(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "log.txt").write_text("x")
    with pytest.raises(NotOwned):
        remove_owned_directory(run, MARK)
    assert _tree(run) == {"log.txt": "x"}
    (run / MARK).write_text("")
    remove_owned_directory(run, MARK)
    assert not run.exists()


def test_replace_path_swaps_a_directory_over_a_directory_and_a_file_over_a_file(tmp_path):
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "shard").write_text("new")
    (tmp_path / "last.ckpt").mkdir()
    (tmp_path / "last.ckpt" / "shard").write_text("old")
    replace_path(tmp_path / "new", tmp_path / "last.ckpt")
    assert _tree(tmp_path / "last.ckpt") == {"shard": "new"}
    (tmp_path / "a.tmp").write_text("a")
    (tmp_path / "a").write_text("old a")
    replace_path(tmp_path / "a.tmp", tmp_path / "a")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "last.ckpt"] and (tmp_path / "a").read_text() == "a"


def test_artifacts_imports_the_standard_library_only():
    code = (
        "import sys, rlhf_lit.artifacts\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'lightning', 'transformers', 'numpy')"
        " or (m.startswith('rlhf_lit.') and m != 'rlhf_lit.artifacts')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60, env=subprocess_env()
    )
    assert json.loads(out.stdout.strip().replace("'", '"')) == [], out.stdout + out.stderr

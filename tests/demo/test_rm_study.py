"""The rankings-vs-pairs RM study: its training data, held-out set, commands, arithmetic and folder rules."""

from __future__ import annotations

import json
import subprocess

import cli_forked
import pytest

from demo.rm_study import MARKER, RUN_MARKER, Run, claim, fit_command, heldout_sets, run_one, train_records
from demo.rm_study_report import markdown, summarise

# Two prompts, K = 3: prompt "p" (paragraph 4) scores 0.5, 0.1, 0.5 (a tie at the top); prompt "q"
# (paragraph 5) has an empty sample and scores 0.2, -0.3 for the others.
JUDGED = {
    "paragraphs": [4, 5],
    "prompts": ["p"] * 3 + ["q"] * 3,
    "responses": ["a", "b", "c", "d", "", "f"],
    "scores": [0.5, 0.1, 0.5, 0.2, 0.9, -0.3],
}


def test_training_data_of_each_variant_from_the_same_samples(tmp_path):
    counts = {v: train_records(JUDGED, Run(v, 0, tmp_path), 3)[1] for v in ("best_worst", "ranking", "all_pairs")}
    # best_worst: p -> a (first max) vs b; q -> d vs the empty sample: dropped.
    assert counts["best_worst"] == {"records": 1, "comparisons": 1, "sequences": 2, "ties": 0, "empty": 1}
    # ranking: p -> [a, c, b] ranks [0, 0, 1]: 2 comparisons (a = c is none); q -> [d, f] without the empty one.
    assert counts["ranking"] == {"records": 2, "comparisons": 3, "sequences": 5, "ties": 0, "empty": 0}
    # all_pairs: p -> (a, b), (a, c) tied and dropped, (b, c); q -> (d, f) only, 2 pairs with the empty sample dropped.
    assert counts["all_pairs"] == {"records": 3, "comparisons": 3, "sequences": 6, "ties": 1, "empty": 2}
    records, _ = train_records(JUDGED, Run("ranking", 0, tmp_path), 3)
    assert [r["responses"] for r in records] == [["a", "c", "b"], ["d", "f"]]


def test_heldout_set_is_the_same_pairs_in_both_formats(tmp_path):
    files = heldout_sets(JUDGED, 3, tmp_path)
    pairs = [json.loads(line) for line in files["fields"].read_text().splitlines()]
    rankings = [json.loads(line) for line in files["rankings"].read_text().splitlines()]
    assert [(p["chosen"], p["rejected"]) for p in pairs] == [("a", "b"), ("c", "b"), ("d", "f")]
    assert [(r["responses"], r["ranks"], r["scores"]) for r in rankings] == [
        (["a", "b"], [0, 1], [0.5, 0.1]),
        (["c", "b"], [0, 1], [0.5, 0.1]),
        (["d", "f"], [0, 1], [0.2, -0.3]),
    ]


def test_fit_command_validates_every_run_on_the_held_out_set_in_its_format(tmp_path):
    heldout = {"fields": tmp_path / "pairs.jsonl", "rankings": tmp_path / "rankings.jsonl"}

    def option(cmd, name):
        return cmd[cmd.index(name) + 1]

    for variant, fmt in (("best_worst", "fields"), ("all_pairs", "fields"), ("ranking", "rankings")):
        run = Run(variant, 2, tmp_path / variant)
        cmd = fit_command(run, "sft", tmp_path / "train.jsonl", heldout, ["--trainer.max_epochs", "1"])
        assert option(cmd, "--data.init_args.format") == fmt
        assert option(cmd, "--data.init_args.val_path") == str(heldout[fmt])
        assert option(cmd, "--data.init_args.val_fraction") == "0"  # every prompt trains
        assert option(cmd, "--seed_everything") == "2" and option(cmd, "--data.init_args.seed") == "2"
        assert option(cmd, "--data.init_args.fields.ranks") == ("ranks" if fmt == "rankings" else "null")
        assert cmd[-2:] == ["--trainer.max_epochs", "1"]  # overrides last: they win


def _result(variant, seed, accuracy, loss, seconds):
    return {
        "variant": variant,
        "seed": seed,
        "fit_seconds": seconds,
        "counts": {"records": 100 + seed, "comparisons": 600, "sequences": 400, "ties": 0, "empty": 0},
        "val": {"val/accuracy": accuracy, "val/loss": loss},
    }


def test_summary_over_seeds_by_hand():
    results = [
        _result("best_worst", 0, [0.80, 0.84], [0.40, 0.38], 10.0),
        _result("best_worst", 1, [0.82, 0.88], [0.36, 0.30], 14.0),
        _result("ranking", 0, [0.90, 0.91], [0.20, 0.19], 30.0),
    ]
    summary = summarise(results)
    assert list(summary) == ["best_worst", "ranking"]
    bw = summary["best_worst"]
    assert bw["seeds"] == [0, 1]
    # final accuracies 0.84, 0.88: mean 0.86, sample std 0.02 * sqrt(2), se = 0.02.
    assert bw["accuracy"][0] == pytest.approx(0.86) and bw["accuracy"][1] == pytest.approx(0.02)
    assert bw["accuracy_by_epoch"][0][0] == pytest.approx(0.81)
    assert bw["loss"][0] == pytest.approx(0.34) and bw["loss"][1] == pytest.approx(0.04)
    assert bw["fit_seconds"][0] == pytest.approx(12.0) and bw["records"][0] == pytest.approx(100.5)
    assert summary["ranking"]["accuracy"] == (0.91, None)  # one seed: no standard error
    setup = {
        "command": "python -m demo rm-study",
        "machine": "m",
        "train_prompts": 100,
        "train_paragraphs": [1000, 1100],
        "samples_per_prompt": 4,
        "judge_calls_per_seed": 400,
        "heldout_pairs": 50,
        "heldout_seed": 12345,
        "heldout_paragraphs": [3256, 3266],
        "wall_seconds": 60.0,
        "sampling_seconds": {"0": 40.0, "1": 42.4},
        "heldout_sampling_seconds": 12.0,
    }
    text = markdown(results, summary, setup)
    assert "| best_worst | 2 | 100 | 600 | 400 | 0.860 ± 0.020 | 0.810 / 0.860 | 0.340 ± 0.040 | 12 |" in text
    assert "| ranking | 1 | 100 | 600 | 400 | 0.910 | 0.900 / 0.910 | 0.190 | 30 |" in text
    assert "paragraphs 3256-3265" in text and "took 40 / 42 s per seed (wall) and 12 s for the held-out set" in text


def test_folder_rules(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="not written by"):
        claim(mine)
    new = tmp_path / "new"
    claim(new)
    claim(new)  # marked: a rerun is accepted
    assert (new / MARKER).is_file()
    # A run folder this command did not start is never cleared.
    run = Run("best_worst", 0, tmp_path / "seed_0" / "best_worst")
    run.dir.mkdir(parents=True)
    (run.dir / "notes.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="not started by"):
        run_one(run, JUDGED, 3, "no-sft", {}, [])
    assert [p.name for p in run.dir.iterdir()] == ["notes.txt"]
    assert RUN_MARKER not in {p.name for p in run.dir.iterdir()}


def _study(*args: str, cwd) -> subprocess.CompletedProcess:
    """``python -m demo rm-study <args>`` in a process of its own, as a user runs it (its runs forked
    from it: tests/cli_forked.py)."""
    return cli_forked.run_module("demo", "rm-study", *args, cwd=cwd)


def test_tiny_study_end_to_end_and_resumed(stories_path, tinystories, tmp_path):
    out = tmp_path / "study"
    args = [
        "--sft",
        stories_path,
        "--paragraphs",
        tinystories,
        "--out",
        str(out),
        "--seeds",
        "0",
        "--variants",
        "best_worst",
        "ranking",
        "--count",
        "12",
        "--heldout-count",
        "6",
        "--max-new-tokens",
        "8",
        "--jobs",
        "1",
        "--rm-overrides",
        "--trainer.max_epochs 1 --data.init_args.batch_size 2 --model.init_args.optimizer.warmup_steps 0",
    ]
    first = _study(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    study = json.loads((out / "study.json").read_text())
    assert list(study["summary"]) == ["best_worst", "ranking"]
    assert study["setup"]["judge_calls_per_seed"] == 12 * 4 and study["setup"]["heldout_paragraphs"] == [3256, 3262]
    held = [json.loads(line) for line in (out / "heldout" / "pairs.jsonl").read_text().splitlines()]
    assert held and all(3256 <= p["paragraph"] < 3262 and p["chosen_score"] > p["rejected_score"] for p in held)
    assert study["setup"]["heldout_pairs"] == len(held)
    for run in study["runs"]:  # each RM was validated on the held-out set: one val/accuracy per epoch
        assert len(run["val"]["val/accuracy"]) == 1 and 0.0 <= run["val"]["val/accuracy"][0] <= 1.0
    rankings = [json.loads(line) for line in (out / "seed_0" / "ranking" / "train.jsonl").read_text().splitlines()]
    assert all(1000 <= r["paragraph"] < 1012 and r["scores"] == sorted(r["scores"], reverse=True) for r in rankings)
    assert "| ranking | 1 |" in (out / "study.md").read_text()

    # A rerun finds every run finished: nothing is trained again, the report is the same.
    finished = (out / "seed_0" / "ranking" / "result.json").stat().st_mtime_ns
    again = _study(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (out / "seed_0" / "ranking" / "result.json").stat().st_mtime_ns == finished
    assert json.loads((out / "study.json").read_text())["runs"] == study["runs"]

    # --report-only trains nothing: an unfinished variant is left out, and said.
    partial = _study(*args, "--report-only", "--variants", "ranking", "all_pairs", cwd=tmp_path)
    assert partial.returncode == 0, partial.stderr[-3000:]
    assert "[rm-study] all_pairs seed 0: not finished, left out" in partial.stdout
    assert not (out / "seed_0" / "all_pairs").exists()
    assert list(json.loads((out / "study.json").read_text())["summary"]) == ["ranking"]

    # A folder it did not write is refused with one line, and left as it was.
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    refused = _study("--sft", stories_path, "--out", str(foreign), cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        f"error: --out {foreign} is not empty and was not written by `python -m demo rm-study`"
    ]
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]

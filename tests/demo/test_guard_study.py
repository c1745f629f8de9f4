"""``python -m demo guard``: the weaker proxy's labels, the study's arithmetic, its folder rules,
and a tiny end-to-end run through the command as a user types it."""

from __future__ import annotations

import json
import math
import os
import subprocess

import cli_forked
import pytest
from assets_paths import STORIES260K, TINYSTORIES
from cli_in_process import run_entry

from demo.guard_report import markdown, summarise
from demo.guard_study import MARKER, RUN_MARKER, fired, relabel, rm_steps


def _pair(i: int, chosen: float, rejected: float) -> dict:
    return {
        "prompt": f"p{i}",
        "chosen": f"c{i}",
        "rejected": f"r{i}",
        "chosen_score": chosen,
        "rejected_score": rejected,
    }


def test_relabel_draws_each_label_from_the_bradley_terry_probability():
    pairs = [_pair(i, 0.5, 0.0) for i in range(200)]
    # A gap of 0.5 at temperature 0.5: the first stays chosen with probability sigmoid(1) = 0.731.
    out = relabel(pairs, 200, 0.5, seed=3)
    kept = sum(p["chosen"].startswith("c") for p in out)
    assert abs(kept / 200 - 1 / (1 + math.exp(-1))) < 0.1  # 200 draws: s.e. 0.031
    flipped = next(p for p in out if p["chosen"].startswith("r"))
    i = flipped["prompt"][1:]
    assert flipped == {
        "prompt": f"p{i}",
        "chosen": f"r{i}",
        "rejected": f"c{i}",
        "chosen_score": 0.0,
        "rejected_score": 0.5,
    }  # the scores travel with their responses
    # A temperature far below the gaps keeps every label; the same seed draws the same pairs.
    sharp = relabel(pairs, 50, 1e-6, seed=3)
    assert all(p["chosen"].startswith("c") for p in sharp)
    assert [p["prompt"] for p in sharp] == [p["prompt"] for p in relabel(pairs, 50, 1e-6, seed=3)]
    assert len({p["prompt"] for p in sharp}) == 50  # drawn without replacement
    with pytest.raises(ValueError, match="--proxy-pairs 201"):
        relabel(pairs, 201, 0.5, seed=0)


def test_rm_steps_counts_the_trained_pairs_in_batches_of_16_over_two_epochs():
    assert rm_steps(64) == 8  # 64 - 7 held out = 57 pairs: 4 batches x 2 epochs
    assert rm_steps(200) == 24  # 180 pairs: 12 batches x 2


def test_fired_reads_the_acted_scalar_at_step_rollout_minus_one():
    scalars = {"guard/kl/acted": ([0.0, 1.0, 2.0, 3.0], [0.0, 1.0, 0.0, 1.0])}
    assert fired(scalars, "kl") == [2, 4]
    assert fired(scalars, "length") == []


def _result(seed: int, export: tuple[float, float], last: tuple[float, float], kept: int | None) -> dict:
    def metrics(judge: float, kl: float) -> dict:
        return {"judge_mean": judge, "kl_mean": kl, "distinct_2": 0.5, "length_mean": 40.0}

    return {
        "seed": seed,
        "kept_rollout": kept,
        "fired": {"proxy_gold": [30] if kept else [], "kl": [11]},
        "exported": metrics(*export),
        "last": metrics(*last),
    }


def test_summarise_compares_the_export_with_the_last_policy_per_seed_and_over_seeds():
    results = [_result(1, (0.70, 10.0), (0.60, 30.0), 25), _result(0, (0.80, 12.0), (0.50, 40.0), 20)]
    summary = summarise(results, {"kl_coef": 0.0})
    rows = summary["seeds"]
    assert [r["seed"] for r in rows] == [0, 1]
    assert rows[0]["kl_saved"] == pytest.approx(28.0) and rows[1]["kl_saved"] == pytest.approx(20.0)
    assert rows[0]["judge_change"] == pytest.approx(0.30) and rows[1]["judge_change"] == pytest.approx(0.10)
    mean = summary["mean"]
    assert mean["kl_saved"]["mean"] == pytest.approx(24.0)
    assert mean["kl_saved"]["se"] == pytest.approx(4.0)  # sample std 5.657 / sqrt(2)
    assert mean["export_judge_mean"]["mean"] == pytest.approx(0.75) and mean["last_judge_mean"][
        "mean"
    ] == pytest.approx(0.55)
    text = "\n".join(markdown(summary))
    assert "| 0 | 20 | 0.800 | 0.500 | 12.00 | 40.00 | 28.00 |" in text
    assert "| mean ± s.e. | | 0.750 ± 0.050 | 0.550 ± 0.050 | 11.00 ± 1.00 | 35.00 ± 5.00 | 24.00 ± 4.00 |" in text
    assert "| 0 | 11 | 30 |" in text  # kl, proxy_gold (alphabetical)
    never = summarise([_result(0, (0.5, 9.0), (0.5, 9.0), None)], {})
    assert "| 0 | last (never fired) |" in "\n".join(markdown(never))
    assert never["mean"]["kl_saved"]["se"] is None  # one seed: no standard error


def _tiny_demo(root) -> None:
    """A demo folder with what the study reads: an SFT model, PPO prompts and judge-scored pairs."""
    (root / "sft").mkdir(parents=True)
    os.symlink(STORIES260K, root / "sft" / "model")
    (root / "data").mkdir()
    paragraphs = TINYSTORIES.read_text(encoding="utf-8").split("\n\n")[2500:2540]
    (root / "data" / "ppo.txt").write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
    (root / "prefs").mkdir()
    pairs = [
        {
            "prompt": "Once upon a time",
            "chosen": f" a happy dog {i}.",
            "rejected": f" a sad cat {i}.",
            "chosen_score": 0.6,
            "rejected_score": -0.4,
        }
        for i in range(40)
    ]
    (root / "prefs" / "preferences.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs), encoding="utf-8")


TINY = (
    "--seeds",
    "0",
    "--rollouts",
    "4",
    "--held-out-every",
    "1",
    "--held-out-prompts",
    "4",
    "--eval-count",
    "8",
    "--proxy-pairs",
    "32",
    "--tiny",
)


def _guard(*args: str, cwd) -> subprocess.CompletedProcess:
    """``python -m demo guard <args>`` in a process of its own, as a user runs it (its runs forked from
    it: tests/cli_forked.py)."""
    return cli_forked.run_module("demo", "guard", *args, cwd=cwd)


@pytest.mark.slow
def test_a_tiny_study_trains_the_proxy_runs_the_guarded_ppo_and_reports_and_a_rerun_reuses_it(tmp_path):
    _tiny_demo(tmp_path / "demo")
    done = _guard("--demo", "demo", "--out", "study", *TINY, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    study = tmp_path / "study"
    assert (study / MARKER).is_file() and (study / "guard.png").stat().st_size > 0
    proxy = json.loads((study / "proxy" / "done.json").read_text())
    assert proxy["pairs"] == 32 and len((study / "proxy" / "preferences.jsonl").read_text().splitlines()) == 32
    result = json.loads((study / "seed_0" / "result.json").read_text())
    assert result["held_out"]["rollouts"] == [1, 2, 3, 4]  # the guard evaluated after every rollout
    assert len(result["curves"]["objective/scores"]) == 4 and len(result["curves"]["objective/judge"]) == 4
    assert set(result["fired"]) == {"proxy_gold", "kl", "length", "distinct", "objective"}
    for policy in ("exported", "last"):
        assert result[policy]["num_samples"] == 8
    # "last" is the policy of the final rollout's checkpoint, weight for weight (what the run exports without keep_best).
    import torch
    from safetensors.torch import load_file

    state = torch.load(study / "seed_0" / "checkpoints" / "rollout=4.ckpt", map_location="cpu", weights_only=False)
    policy = {k.removeprefix("policy."): v for k, v in state["state_dict"].items() if k.startswith("policy.")}
    last = load_file(study / "seed_0" / "last" / "model.safetensors")
    assert policy.keys() >= last.keys() and last
    assert all(torch.equal(last[k], policy[k]) for k in last)
    assert json.loads((study / "seed_0" / "eval_last.json").read_text())["config"]["policy"].endswith("last")
    log = (study / "seed_0" / "log.txt").read_text()
    assert (
        "OverOptimisationGuard" in (study / "ppo_guard.yaml").read_text() and "--model.init_args.kl.init_coef 0" in log
    )
    summary = json.loads((study / "study.json").read_text())
    assert summary["seeds"][0]["kl_saved"] == pytest.approx(result["last"]["kl_mean"] - result["exported"]["kl_mean"])
    assert "| seed | kept rollout |" in (study / "study.md").read_text()

    # A rerun reuses every finished part: nothing is trained or measured again.
    stamp = (study / "seed_0" / "result.json").stat().st_mtime_ns
    again = run_entry(_main, "guard", "--demo", "demo", "--out", "study", *TINY, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (study / "seed_0" / "result.json").stat().st_mtime_ns == stamp
    assert "[guard] seed 0: done" in again.stdout


def _main(argv):
    from demo.__main__ import main

    return main(argv)


def test_refusals_a_demo_without_its_models_a_foreign_out_and_a_foreign_run_folder(tmp_path):
    result = _guard("--demo", "nowhere", "--out", "study", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: --demo nowhere has no sft/model: run `make demo` (or the pipeline with --out nowhere) first"
    )
    assert not (tmp_path / "study").exists()
    _tiny_demo(tmp_path / "demo")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    result = run_entry(_main, "guard", "--demo", "demo", "--out", "mine", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: --out mine is not empty and was not written by `python -m demo guard`"
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    # A run folder under our --out that this command did not start is never cleared.
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / MARKER).write_text("{}")
    (ours / "proxy").mkdir()
    (ours / "proxy" / "notes.txt").write_text("keep")
    result = run_entry(_main, "guard", "--demo", "demo", "--out", "ours", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().endswith("was not started by `python -m demo guard`: move it away")
    assert [p.name for p in (ours / "proxy").iterdir()] == ["notes.txt"]
    assert not (ours / "proxy" / RUN_MARKER).exists()
    result = run_entry(_main, "guard", "--demo", "demo", "--out", "new", "--rollouts", "0", cwd=tmp_path)
    assert result.returncode == 2 and "--rollouts: '0': must be > 0" in result.stderr

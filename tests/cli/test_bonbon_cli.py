"""BoNBoN as a user runs it: `rlhf-lit best-of-n --pairs-out` draws and ranks the pairs, `rlhf-lit fit --config
configs/offline/bonbon.yaml` trains on the shipped ones, and the export is a policy `rlhf-lit evaluate` reads."""

from __future__ import annotations

import csv
import json
import re
import shlex

import torch
from assets_paths import ASSETS, BONBON_PAIRS
from cli_helpers import ROOT, STORIES, error_line, run_main

from rlhf_lit.artifacts import jsonl_file_state
from rlhf_lit.stages import BoNBoNModule

JUDGE = "rlhf_lit.evaluation.judges:vader"


def test_pairs_out_keeps_the_best_and_the_worst_of_the_judged_samples(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Once upon a time\nThe dog ran\nLily was sad\n")
    common = ["--policy", str(STORIES), "--prompts", str(prompts), "--max-new-tokens", "12", "--seed", "2"]
    result = run_main(
        "best-of-n", *common, "--pick-by", "judge", "--judge", JUDGE, "--n", "2,4", "--num-samples", "6",
        "--out", "bon.json", "--pairs-out", "pairs.jsonl", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((tmp_path / "bon.json").read_text())
    assert data["config"]["pick_by"] == "judge" and data["rows"][0]["rm_mean"] is None  # no reward model
    records = [json.loads(line) for line in (tmp_path / "pairs.jsonl").read_text().splitlines()]
    assert data["pairs"] == {
        "file": "pairs.jsonl",
        "n": 4,
        "written": len(records),
        "tied": 3 - len(records),
        "empty": 0,
    }
    assert records
    for r in records:
        # The first N = 4 of the prompt's 6 samples; argmax and argmin of the judge, the first drawn on ties.
        drawn = [s for s in data["samples"] if s["prompt_index"] == r["prompt_index"] and s["sample_index"] < 4]
        best = max(drawn, key=lambda s: (s["judge"], -s["sample_index"]))
        worst = min(drawn, key=lambda s: (s["judge"], s["sample_index"]))
        assert (r["chosen"], r["chosen_score"]) == (best["response"], best["judge"])
        assert (r["rejected"], r["rejected_score"]) == (worst["response"], worst["judge"])
        assert r["chosen_score"] > r["rejected_score"]
        assert r["n"] == 4 and r["scored_by"] == f"judge {JUDGE}" and r["written_by"] == "rlhf-lit best-of-n"
        assert r["prompt"] == prompts.read_text().splitlines()[r["prompt_index"]]
    # A file rlhf-lit did not write is never replaced; its own only with --overwrite.
    assert jsonl_file_state(tmp_path / "pairs.jsonl", "rlhf-lit ") == "owned"
    (tmp_path / "theirs.jsonl").write_text('{"prompt": "mine"}\n')
    for target, extra, message in (
        ("theirs.jsonl", ["--overwrite"], "--pairs-out theirs.jsonl exists and was not written by rlhf-lit"),
        ("pairs.jsonl", [], "--pairs-out pairs.jsonl exists; pass --overwrite"),
    ):
        pick = ["--pick-by", "judge", "--judge", JUDGE, "--pairs-out", target, *extra]
        refused = run_main("best-of-n", *common, *pick, cwd=tmp_path)
        assert refused.returncode == 2 and message in error_line(refused)


def test_picking_options_are_checked_before_sampling(tmp_path):
    (tmp_path / "p.txt").write_text("Once\n")
    base = ["best-of-n", "--policy", str(STORIES), "--prompts", "p.txt"]
    for extra, message in (
        ([], "--reward-model is required to pick by it (or give --pick-by judge with a --judge)"),
        (["--pick-by", "judge"], "--pick-by judge needs a --judge"),
        (["--pick-by", "judge", "--judge", JUDGE, "--n", "1", "--pairs-out", "x.jsonl"], "--pairs-out needs N >= 2"),
    ):
        result = run_main(*base, *extra, cwd=tmp_path)
        assert result.returncode == 2 and message in error_line(result), extra


def test_the_shipped_pairs_are_what_the_documented_command_writes(tmp_path):
    # The command of assets/README.md, on its first 8 prompts: the same first batch of samples (64 = 8 x 8
    # rows), so the records of those prompts are the shipped file's.
    (command,) = re.findall(r"^rlhf-lit best-of-n .*$", (ASSETS / "README.md").read_text(), re.MULTILINE)
    args = shlex.split(command)[1:]
    args[args.index("--pairs-out") + 1] = str(tmp_path / "pairs.jsonl")
    result = run_main(*args, "--max-prompts", "8", cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    written = (tmp_path / "pairs.jsonl").read_text().splitlines()
    shipped = BONBON_PAIRS.read_text().splitlines()
    assert written and written == [line for line in shipped if json.loads(line)["prompt_index"] < 8]
    assert {json.loads(line)["n"] for line in shipped} == {8} and len(shipped) == 320


def _fit(tmp_path, *extra: str):
    return run_main(
        "fit", "--config", "configs/offline/bonbon.yaml", "--run_dir", str(tmp_path / "run"),
        "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
        "--trainer.logger.init_args.save_dir", str(tmp_path / "run" / "logs"),
        "--trainer.max_steps", "3", "--trainer.val_check_interval", "3", "--trainer.log_every_n_steps", "1",
        "--model.init_args.optimizer.warmup_steps", "1", "--data.init_args.max_records", "64", *extra, cwd=ROOT,
    )  # fmt: skip


def test_offline_bonbon_config_trains_and_exports_a_policy_evaluate_reads(tmp_path):
    result = _fit(tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "BoNBoN: N = 8, beta = 1 / (2 (N - 1) H_(N-1)) = 0.0275482" in result.stderr  # 1 / 36.3, from the records
    rows = list(csv.DictReader(next((tmp_path / "run" / "logs").rglob("metrics.csv")).open()))
    logged = {k for row in rows for k, v in row.items() if v}
    for name in ("train/loss", "train/sft_loss", "train/ipo_loss", "train/reward_margin", "val/loss", "val/ipo_loss"):
        assert name in logged, sorted(logged)
    # The checkpoint leaves the frozen reference out and loads back (N then read again from the records).
    ckpt = next((tmp_path / "run").rglob("last.ckpt"))
    restored = BoNBoNModule.load_from_checkpoint(ckpt, weights_only=True)
    assert restored.n is None and restored.alpha == 0.005 and "ref_model" in restored._modules
    assert not any(k.startswith("ref_model.") for k in torch.load(ckpt, weights_only=True)["state_dict"])
    export = tmp_path / "run" / "bonbon" / "model"
    (tmp_path / "p.txt").write_text("Once upon a time\n")
    evaluated = run_main(
        "evaluate", "--policy", str(export), "--reference", str(STORIES), "--prompts", "p.txt",
        "--max-new-tokens", "4", "--out", "eval.json", cwd=tmp_path,
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert json.loads((tmp_path / "eval.json").read_text())["metrics"]["num_samples"] == 1


def test_an_n_the_records_disagree_with_stops_before_training(tmp_path):
    result = _fit(tmp_path, "--model.init_args.n", "4")
    assert result.returncode == 1
    line = error_line(result)
    assert "bonbon_pairs.jsonl line 1: field 'n' is 8, but BoNBoN's n is 4: beta is derived from N" in line
    assert not (tmp_path / "run" / "bonbon" / "model").exists()

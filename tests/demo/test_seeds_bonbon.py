"""BoNBoN and the best-of-N sweep in the seeds study: their jobs and commands (training prompts only for the
pairs, held-out ones for the sweep), their cost, and every policy against best-of-N over seeds."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from demo.seeds import Job, fit_command, plan
from demo.seeds_bonbon import pairs_command, parse_ns, parse_sources, sampling_compute, sweep_command, training_prompts
from demo.seeds_frontier import best_of_n_over_seeds, markdown, pair_methods
from demo.seeds_report import frontier_points, write_study
from demo.story_prompts import RANGES

SFT = {"judge_mean": 0.3, "kl_mean": 0.0, "distinct_2": 0.8, "length_mean": 46.0, "ended_fraction": 0.1}


def _option(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_ns_and_prompt_ranges_are_checked():
    assert parse_ns("4,8,16") == (4, 8, 16)
    assert parse_ns("8, 4,8") == (8, 4)
    for bad in ("", "1,4", "x", "0"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_ns(bad)
    assert parse_sources("ppo,reward_model") == ("ppo", "reward_model")
    for bad in ("", "eval", "ppo,eval", "sft"):  # never the held-out range (nor SFT's)
        with pytest.raises(argparse.ArgumentTypeError):
            parse_sources(bad)


def test_plan_runs_bonbon_per_n_and_the_sweep_per_seed(tmp_path):
    jobs = plan(tmp_path, [0, 1], [], [], bonbon_ns=(4, 16), bonbon_args=("--x", "1"), bon_n_max=64)
    assert [(j.method, j.name, j.seed, j.n, j.dir.relative_to(tmp_path).as_posix()) for j in jobs] == [
        ("bonbon", "n_4", 0, 4, "bonbon/n_4/seed_0"),
        ("bonbon", "n_4", 1, 4, "bonbon/n_4/seed_1"),
        ("bonbon", "n_16", 0, 16, "bonbon/n_16/seed_0"),
        ("bonbon", "n_16", 1, 16, "bonbon/n_16/seed_1"),
        ("best_of_n", "sweep", 0, 64, "best_of_n/seed_0"),
        ("best_of_n", "sweep", 1, 64, "best_of_n/seed_1"),
    ]
    assert jobs[0].overrides == ("--x", "1")
    # The fit reads the job's own pairs, starts from the SFT model, and takes the seed and the settings last.
    cmd = fit_command(jobs[1], tmp_path / "demo", 10)
    assert _option(cmd, "--config").endswith("configs/demo/bonbon.yaml")
    assert _option(cmd, "--data.init_args.train_path") == str(jobs[1].dir / "pairs.jsonl")
    assert _option(cmd, "--model.init_args.model") == str(tmp_path / "demo" / "sft" / "model")
    assert _option(cmd, "--data.init_args.seed") == "1" and cmd[-2:] == ["--x", "1"]


def test_the_pairs_are_drawn_on_training_prompts_and_the_sweep_on_held_out_ones(tmp_path):
    demo = tmp_path / "demo"
    (demo / "data").mkdir(parents=True)
    (demo / "data" / "ppo.txt").write_text("A ppo story.\n\nAnother ppo story.\n")
    (demo / "data" / "reward_model.txt").write_text("An rm story.\n")
    assert training_prompts(demo, ("ppo",), tmp_path) == demo / "data" / "ppo.txt"
    both = training_prompts(demo, ("ppo", "reward_model"), tmp_path)
    assert both.read_text() == "A ppo story.\n\nAnother ppo story.\n\nAn rm story.\n"  # three paragraphs

    cmd = pairs_command(demo, both, 8, 2, 48, tmp_path)
    assert _option(cmd, "--prompts") == str(both) and _option(cmd, "--prompt-format") == "paragraphs"
    assert _option(cmd, "--n") == "8" and _option(cmd, "--seed") == "2"
    assert _option(cmd, "--pairs-out") == str(tmp_path / "pairs.jsonl")
    assert _option(cmd, "--policy") == str(demo / "sft" / "model")
    assert _option(cmd, "--reward-model") == str(demo / "reward_model" / "model")
    assert _option(cmd, "--unfinished") == "with_eos"  # as PPO's reward reads a cut response

    # The sweep's prompts: the first `count` paragraphs of the evaluation range, their first 8 words.
    paragraphs = [f"story {i} has these words one two three four five six" for i in range(RANGES["eval"][0] + 3)]
    stories = tmp_path / "val.txt"
    stories.write_text("\n\n".join(paragraphs) + "\n")
    cmd = sweep_command(demo, str(stories), 2, 64, 1, 48, tmp_path, "m:f")
    start = RANGES["eval"][0]
    written = [json.loads(line)["prompt"] for line in (tmp_path / "prompts.jsonl").read_text().splitlines()]
    assert written == [f"story {i} has these words one two three" for i in (start, start + 1)]
    assert _option(cmd, "--n-max") == "64" and _option(cmd, "--judge") == "m:f" and "--pairs-out" not in cmd


def test_sampling_compute_counts_every_sample_once(tmp_path):
    path = tmp_path / "bon.json"
    path.write_text(json.dumps({"config": {"num_prompts": 500, "num_samples": 8, "ns": [8]}, "rows": []}))
    assert sampling_compute(path) == {"prompts": 500, "samples": 4000, "rm_passes": 4000}


def _sweep(seed: int, judges: list[float | None], seconds: float) -> dict:
    ns = [1, 4, 16]
    return {
        "method": "best_of_n",
        "seed": seed,
        "rows": [
            {"n": n, "kl_analytic": math.log(n) - (n - 1) / n, "judge_mean": j} for n, j in zip(ns, judges, strict=True)
        ],
        "compute": {"samples": 2048, "rm_passes": 2048, "sampling_s": seconds},
    }


def _bonbon(seed: int, n: int, judge: float, kl: float, d2: float, seconds: float) -> dict:
    metrics = {"judge_mean": judge, "kl_mean": kl, "distinct_2": d2, "length_mean": 46.0, "ended_fraction": 0.1}
    return {
        "method": "bonbon",
        "name": f"n_{n}",
        "seed": seed,
        "overrides": [],
        "curves": {},
        "evaluations": {"final": metrics},
        "compute": {"samples": 500 * n, "rm_passes": 500 * n, "sampling_s": seconds, "train_s": 2 * seconds},
    }


def test_best_of_n_over_seeds_keeps_the_n_every_sweep_has():
    bon = best_of_n_over_seeds([_sweep(0, [0.3, 0.6, 0.8], 10.0), _sweep(1, [0.32, 0.64, None], 14.0)])
    assert list(bon) == [1, 4]  # N = 16 has no judge score in seed 1
    assert bon[4]["judge_mean"]["mean"] == pytest.approx(0.62)
    assert bon[4]["judge_mean"]["se"] == pytest.approx(0.02)  # sample std 0.02 sqrt(2) over sqrt(2)
    assert bon[4]["kl"] == pytest.approx(math.log(4) - 0.75)
    assert bon[1]["compute"]["sampling_s"]["mean"] == pytest.approx(12.0)


def test_each_bonbon_seed_is_compared_with_best_of_n_at_its_kl():
    # Best-of-N's mean curve: (0, 0.3), (log 4 - 0.75 = 0.6363, 0.6), (log 16 - 15/16 = 1.8351, 0.8).
    k4, k16 = math.log(4) - 0.75, math.log(16) - 15 / 16
    curve = [(0.0, 0.3), (k4, 0.6), (k16, 0.8)]
    results = [
        _bonbon(0, 8, judge=0.65, kl=1.0, d2=0.72, seconds=10.0),
        _bonbon(1, 8, judge=0.60, kl=1.2, d2=0.68, seconds=20.0),
        _bonbon(0, 16, judge=0.9, kl=2.5, d2=0.6, seconds=30.0),  # beyond N = 16's KL: no comparison
        {**_bonbon(0, 4, 0.5, 0.5, 0.7, 1.0), "method": "ppo"},  # not a pair method: left out
    ]
    methods = pair_methods(results, SFT, curve)
    assert list(methods["bonbon"]) == ["n_8", "n_16"] and methods["dpo"] == {}
    rows = methods["bonbon"]["n_8"]["seeds"]
    at_0 = 0.6 + 0.2 * (1.0 - k4) / (k16 - k4)
    at_1 = 0.6 + 0.2 * (1.2 - k4) / (k16 - k4)
    assert rows[0]["bon_judge_at_kl"] == pytest.approx(at_0)
    assert rows[1]["judge_minus_bon"] == pytest.approx(0.60 - at_1)
    assert rows[0]["distinct_2_ratio"] == pytest.approx(0.9)
    mean = methods["bonbon"]["n_8"]["mean"]
    assert mean["judge_minus_bon"]["mean"] == pytest.approx(((0.65 - at_0) + (0.60 - at_1)) / 2)
    assert mean["judge_minus_bon"]["se"] == pytest.approx(abs((0.65 - at_0) - (0.60 - at_1)) / 2)
    assert mean["samples"]["mean"] == 4000 and mean["train_s"]["mean"] == pytest.approx(30.0)
    assert "judge_minus_bon" not in methods["bonbon"]["n_16"]["seeds"][0]
    text = "\n".join(markdown(methods, {}))
    assert "## BoNBoN" in text and "| n_8 | 0.625 +- 0.025 | 1.10 +- 0.10 |" in text


def test_the_study_draws_bonbon_and_the_sweeps_mean(tmp_path):
    sweeps = [_sweep(0, [0.3, 0.6, 0.8], 10.0), _sweep(1, [0.3, 0.64, 0.84], 14.0)]
    results = [_bonbon(0, 8, 0.65, 1.0, 0.72, 10.0), _bonbon(1, 8, 0.61, 1.2, 0.68, 20.0)]
    path = write_study(results, SFT, str(tmp_path), sweeps=sweeps)
    summary = json.loads((tmp_path / "study.json").read_text())
    # The curve compared with is the sweeps' mean: N = 4 at 0.62, N = 16 at 0.82.
    k4, k16 = math.log(4) - 0.75, math.log(16) - 15 / 16
    row = summary["pair_methods"]["bonbon"]["n_8"]["seeds"][0]
    assert row["bon_judge_at_kl"] == pytest.approx(0.62 + 0.2 * (1.0 - k4) / (k16 - k4))
    points = frontier_points(summary, None)
    by_method = {p.method: p for p in points}
    assert by_method["BoNBoN"].score == pytest.approx(0.63) and by_method["BoNBoN"].kl == pytest.approx(1.1)
    bon = [p for p in points if p.method == "best-of-N"]
    assert [p.score for p in bon] == pytest.approx([0.3, 0.62, 0.82]) and all(p.kl_analytic for p in bon)
    text = open(path, encoding="utf-8").read()
    assert "## Best-of-N over seeds" in text and "## BoNBoN" in text and (tmp_path / "frontier.png").is_file()


def test_a_bonbon_job_is_a_job_with_its_n():
    job = Job("bonbon", "n_4", 0, (), Path("x"), 4)
    assert job.n == 4 and job.sources == ("ppo",) and job.result_path.name == "result.json"


def test_a_bonbon_run_draws_its_pairs_on_training_prompts_then_fits_on_them(tmp_path, monkeypatch):
    import demo.seeds as seeds

    demo = tmp_path / "demo"
    calls = []

    def run_logged(cmd, log, what):  # records the command; writes what the real one would
        calls.append(cmd)
        if "--pairs-out" in cmd:
            out = Path(_option(cmd, "--out"))
            out.write_text(json.dumps({"config": {"num_prompts": 485, "num_samples": 8}}))
        return 2.5

    monkeypatch.setattr(seeds, "run_logged", run_logged)
    monkeypatch.setattr(seeds, "_evaluate", lambda *args: {"judge_mean": 0.5})
    job = Job("bonbon", "n_8", 1, ("--x", "1"), tmp_path / "study" / "bonbon" / "n_8" / "seed_1", 8)
    result = seeds.run_job(job, demo, seeds.Evaluation("val.txt"), 10)
    pairs, fit = calls
    assert _option(pairs, "--prompts") == str(demo / "data" / "ppo.txt") and _option(pairs, "--n") == "8"
    assert _option(pairs, "--seed") == "1"
    assert _option(fit, "--data.init_args.train_path") == _option(pairs, "--pairs-out")
    assert result["compute"] == {"sampling_s": 2.5, "prompts": 485, "samples": 3880, "rm_passes": 3880, "train_s": 2.5}
    assert result["evaluations"] == {"final": {"judge_mean": 0.5}} and job.result_path.is_file()

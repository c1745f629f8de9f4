"""bench/chat_bonbon_study.py: per method and setting the KL, the judge and the judge minus the seed's own
best-of-N curve at its KL, as means +- s.e. over seeds, worked by hand on two made-up seeds; a value one
seed lacks is left out, not averaged over fewer; a seed's two files that are not of one folder, a seed
given twice, a PPO line without a result for every seed and an unnamed variant among several are refused
by name; the frontier, table and JSON are written in a new folder."""

from __future__ import annotations

import argparse
import json
import sys

import pytest
from assets_paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import chat_bonbon_study  # noqa: E402


def metrics(kl: float, judge: float, distinct_2: float = 0.9, ended: float = 0.1) -> dict:
    return {"kl_mean": kl, "judge_mean": judge, "distinct_2": distinct_2, "ended_fraction": ended}


def seed_files(tmp_path, seed: int, bon: list, dpo: dict, bonbon: dict, ppo: dict, minus_dpo: float):
    """A chat_bonbon result and a chat_ppo_variants result of one seed's folder."""
    base = metrics(0.0, 0.2)
    rows = [{"n": 1, "kl_analytic": 0.0, "judge_mean": 0.21, "ended_fraction": 0.1}]
    rows += [{"n": n, "kl_analytic": kl, "judge_mean": j, "ended_fraction": 0.05 * n} for n, kl, j in bon]
    demo = f"logs/chat_study/seed_{seed}"
    b = {"seed": seed, "demo": demo, "instruction_model": base, "best_of_n": rows, "dpo": {"dpo_beta_0.1": dpo}}
    cost = {"samples": 1024, "rm_passes": 1024, "fit_seconds": 200.0 + 100 * seed}
    b["bonbon"] = {str(n): {"metrics": m, "compute": cost} for n, m in bonbon.items()}
    p = {"seed": seed, "demo": demo, "instruction_model": base, "dpo": {"dpo_beta_0.1": dpo}}
    rollouts = {str(r): m for r, m in ppo.items()}
    p["variants"] = {"shipped": {"rollouts": rollouts, "minus_dpo": {"dpo_beta_0.1": minus_dpo}, "fit_seconds": 500.0}}
    paths = tmp_path / f"bonbon_{seed}.json", tmp_path / f"ppo_{seed}.json"
    paths[0].write_text(json.dumps(b))
    paths[1].write_text(json.dumps(p))
    return paths


@pytest.fixture
def two_seeds(tmp_path):
    # seed 0: best-of-N 0.5 at KL 1, 0.6 at KL 2 (from the instruction model's 0.2 at KL 0)
    s0 = seed_files(
        tmp_path, 0, [(2, 1.0, 0.5), (4, 2.0, 0.6)], metrics(0.5, 0.3), {4: metrics(1.5, 0.45)},
        {8: metrics(1.0, 0.4), 16: metrics(3.0, 0.7, distinct_2=0.8, ended=0.0)}, -0.05,
    )  # fmt: skip
    # seed 1: best-of-N 0.6 at KL 1, 0.8 at KL 2
    s1 = seed_files(
        tmp_path, 1, [(2, 1.0, 0.6), (4, 2.0, 0.8)], metrics(0.5, 0.4), {4: metrics(0.5, 0.3)},
        {8: metrics(2.0, 0.5), 16: metrics(2.0, 0.9)}, -0.15,
    )  # fmt: skip
    return s0, s1


def test_means_and_margins_over_seeds_are_worked_by_hand(two_seeds, tmp_path):
    (b0, p0), (b1, p1) = two_seeds
    out = tmp_path / "study"
    # the results are matched to their seed by what they record, not by their order
    assert chat_bonbon_study.main(["--bonbon", str(b1), "--bonbon", str(b0), "--ppo", f"shipped={p1}",
                                   "--ppo", f"shipped={p0}", "--out", str(out)]) == 0  # fmt: skip
    study = json.loads((out / "study.json").read_text())
    assert study["seeds"] == [0, 1]
    rows = {(r["method"], r["setting"]): r for r in study["rows"]}
    assert list(rows) == [
        ("the instruction model", "-"), ("best-of-N", "N 2"), ("best-of-N", "N 4"), ("DPO", "beta 0.1"),
        ("BoNBoN", "N 4"), ("PPO, shipped", "rollout 8"), ("PPO, shipped", "rollout 16"),
    ]  # fmt: skip

    def stat(key, setting):
        s = rows[setting].get(key)
        return None if s is None else (pytest.approx(s["mean"]), pytest.approx(s["se"]))

    # DPO at KL 0.5: best-of-N 0.35 (seed 0), 0.4 (seed 1): -0.05 and 0.0; s.e. of two values = |a - b| / 2
    assert stat("minus_best_of_n", ("DPO", "beta 0.1")) == (-0.025, 0.025)
    assert stat("judge", ("DPO", "beta 0.1")) == (0.35, 0.05)
    # BoNBoN: at KL 1.5 best-of-N 0.55 (0.45 - 0.55); at KL 0.5 best-of-N 0.4 (0.3 - 0.4)
    assert stat("minus_best_of_n", ("BoNBoN", "N 4")) == (-0.1, 0.0)
    assert stat("kl", ("BoNBoN", "N 4")) == (1.0, 0.5)
    # PPO rollout 8: 0.4 - 0.5 at KL 1, 0.5 - 0.8 at KL 2
    assert stat("minus_best_of_n", ("PPO, shipped", "rollout 8")) == (-0.2, 0.1)
    # rollout 16: seed 0's KL 3 is beyond its best-of-N curve: no mean over the one seed that has it
    assert stat("minus_best_of_n", ("PPO, shipped", "rollout 16")) is None
    assert stat("judge", ("PPO, shipped", "rollout 16")) == (0.8, 0.1)
    assert stat("judge", ("best-of-N", "N 2")) == (0.55, 0.05)
    assert rows[("best-of-N", "N 2")]["kl_analytic"] and not rows[("DPO", "beta 0.1")]["kl_analytic"]
    assert "minus_best_of_n" not in rows[("best-of-N", "N 4")]  # the curve itself is not compared with itself
    assert "distinct_2" not in rows[("best-of-N", "N 4")]  # not measured for best-of-N
    assert stat("ended_fraction", ("best-of-N", "N 4")) == (0.2, 0.0)
    assert stat("distinct_2", ("PPO, shipped", "rollout 16")) == (0.85, 0.05)
    assert stat("ended_fraction", ("PPO, shipped", "rollout 16")) == (0.05, 0.05)
    # cost: BoNBoN's draw and fit; PPO's whole fit at its last checkpoint only
    assert stat("train_s", ("BoNBoN", "N 4")) == (250.0, 50.0)
    assert stat("samples", ("BoNBoN", "N 4")) == (1024, 0.0)
    assert stat("train_s", ("PPO, shipped", "rollout 16")) == (500.0, 0.0)
    assert "train_s" not in rows[("PPO, shipped", "rollout 8")]
    assert study["ppo_minus_dpo"]["shipped"]["dpo_beta_0.1"]["mean"] == pytest.approx(-0.1)
    assert study["ppo_minus_dpo"]["shipped"]["dpo_beta_0.1"]["se"] == pytest.approx(0.05)
    md = (out / "study.md").read_text()
    assert "| PPO, shipped | rollout 8 | 1.50 ± 0.50 | 0.450 ± 0.050 | -0.200 ± 0.100 | 0.900 ± 0.000 |" in md
    assert "| BoNBoN | N 4 | 1.00 ± 0.50 | 0.375 ± 0.075 | -0.100 ± 0.000 | 0.900 ± 0.000 | 0.100 ± 0.000 " in md
    assert "PPO, shipped, minus DPO beta 0.1 at DPO beta 0.1's KL (PPO's curve interpolated): -0.100 ± 0.050." in md
    assert (out / "frontier.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(FileExistsError):  # a new folder: never over an earlier study's
        chat_bonbon_study.main(["--bonbon", str(b0), "--ppo", f"shipped={p0}", "--out", str(out)])


def test_results_not_of_one_folder_or_seed_are_refused_by_name(two_seeds, tmp_path):
    (b0, p0), (b1, p1) = two_seeds
    with pytest.raises(SystemExit, match=r"ppo_1.json: seed 1 has no --bonbon result \(seeds \[0\]\)"):
        chat_bonbon_study.main(["--bonbon", str(b0), "--ppo", f"shipped={p1}", "--out", str(tmp_path / "a")])
    with pytest.raises(SystemExit, match=r"--ppo: no 'calibrated' result of seed 1 \(logs/chat_study/seed_1\)"):
        chat_bonbon_study.main(["--bonbon", str(b0), "--bonbon", str(b1), "--ppo", f"shipped={p0}",
                                "--ppo", f"shipped={p1}", "--ppo", f"calibrated={p0}", "--out", str(tmp_path / "a")])  # fmt: skip
    with pytest.raises(SystemExit, match=r"ppo_0.json: a second 'shipped' result of seed 0"):
        chat_bonbon_study.main(["--bonbon", str(b0), "--ppo", f"shipped={p0}", "--ppo", f"shipped={p0}",
                                "--out", str(tmp_path / "a")])  # fmt: skip
    other = json.loads(p1.read_text())
    other["seed"] = 0  # seed 1's folder's PPO given as seed 0's
    p1.write_text(json.dumps(other))
    with pytest.raises(SystemExit, match=r"bonbon_0.json and .*ppo_1.json: one is seed 0 of logs/chat_study/seed_0, "
                       r"the other seed 0 of logs/chat_study/seed_1"):  # fmt: skip
        chat_bonbon_study.main(["--bonbon", str(b0), "--ppo", f"shipped={p1}", "--out", str(tmp_path / "a")])
    other = json.loads(p0.read_text())
    other["dpo"]["dpo_beta_0.1"]["judge_mean"] = 0.31  # another run's DPO under the same seed and folder
    p0.write_text(json.dumps(other))
    with pytest.raises(SystemExit, match=r"their evaluations of DPO dpo_beta_0.1 differ"):
        chat_bonbon_study.main(["--bonbon", str(b0), "--ppo", f"shipped={p0}", "--out", str(tmp_path / "a")])
    with pytest.raises(SystemExit, match=r"bonbon_1.json: seed 1 is given twice"):
        chat_bonbon_study.main(["--bonbon", str(b1), "--bonbon", str(b1), "--ppo", f"shipped={p1}",
                                "--out", str(tmp_path / "a")])  # fmt: skip
    assert not (tmp_path / "a").exists()  # refused before anything is written


def test_bad_files_and_unnamed_variants_are_refused_by_name(two_seeds, tmp_path):
    (b0, p0), _ = two_seeds
    with pytest.raises(SystemExit, match=r"ppo_0.json: no variants \(not a result of bench/chat_ppo_variants.py\)"):
        data = json.loads(p0.read_text())
        del data["variants"]
        p0.write_text(json.dumps(data))
        chat_bonbon_study.main(["--bonbon", str(b0), "--ppo", f"shipped={p0}", "--out", str(tmp_path / "a")])
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(SystemExit, match=r"broken.json: not a readable JSON result of bench/chat_bonbon.py"):
        chat_bonbon_study.main(["--bonbon", str(tmp_path / "broken.json"), "--ppo", f"x={p0}", "--out", str(tmp_path)])
    two = {"variants": {"a": {"rollouts": 1}, "b": {"rollouts": 2}}}
    assert chat_bonbon_study.ppo_variant(two, tmp_path / "x.json", "b") == {"rollouts": 2}  # read by its label
    with pytest.raises(SystemExit, match=r"x.json: holds the variants \['a', 'b'\]; give the one to read as its label"):
        chat_bonbon_study.ppo_variant(two, tmp_path / "x.json", "c")
    assert chat_bonbon_study.ppo_variant({"variants": {"a": {"rollouts": 1}}}, tmp_path, "any") == {"rollouts": 1}
    for bad in ("x.json", "=x.json", "label="):
        with pytest.raises(argparse.ArgumentTypeError, match="expected LABEL=FILE"):
            chat_bonbon_study.parse_ppo(bad)

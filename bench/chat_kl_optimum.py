"""How much of the reward model's own best policy at a given KL do PPO and DPO reach? Read from finished runs.

    .venv/bin/python bench/chat_kl_optimum.py --demo logs/demo_chat

The policy that maximises the reward model's score at a KL budget is the reference tilted by the score,
``pi_beta(y | x) ∝ pi_ref(y | x) exp(r(x, y) / beta)`` (the KL-regularised objective's optimum that PPO's KL
penalty and DPO's loss both aim at). A finished ``make demo-chat`` folder holds N replies of the instruction
model to each held-out request with their reward-model and judge scores (``best_of_n/best_of_n.json``);
weighting each request's N replies by ``softmax(r / beta)`` is that policy on the drawn replies (the
empirical draw standing for the instruction model). For each beta: its KL to the draw (nats per reply,
``sum w log(N w)``, at most ``log N``), its judge mean and reward-model mean.

Each policy the demo evaluated (``eval/*.json``: PPO's checkpoints and export, DPO) is then set against that
curve at its own KL: its judge gain over the instruction model (the evaluation's one reply a request), the
optimum's gain at that KL (over the draw's mean), and the share of it reached. With ``--rescore`` every reply
(the draw's and the evaluations') is scored again here by the run's reward model, and the same is done for
the reward model's score: a policy that climbs the score at the optimum's rate while the judge lags has
exploited the reward model; one whose shares are alike climbed the score itself slowly (its path).
``--draw`` reads another best-of-N draw of the same run instead (``rlhf-lit best-of-n --n-max 32`` on its
held-out requests and reward model): more replies a request reach further along the curve (its KL is at most
``log N``).

Reads only; writes ``bench/results/chat-kl-optimum-<UTC date>[-N].json``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from results_file import write_result

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BETAS = [16.0, 8.0, 4.0, 3.0, 2.0, 1.5, 1.2, 1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.25, 0.2, 0.15, 0.1]
"""Temperatures of the tilt, from barely moved (KL near 0) to near the best of the N replies (KL near log N)."""


def tilted_frontier(samples: list[dict], betas: list[float] = BETAS) -> dict:
    """The tilted policy ``softmax(rm / beta)`` over each request's drawn replies, for each beta.

    Args:
        samples: best-of-N samples, each with ``prompt_index``, ``rm`` and ``judge``.
        betas: the tilt's temperatures (in the reward model's units).

    Returns:
        ``{"replies_per_request", "base": {"judge", "rm"}, "points": [{"beta", "kl", "judge", "rm"}, ...]}``:
        the draw's means, then per beta the means over requests of the tilted policy's KL (nats), judge and rm.
    """
    by_request: dict[int, list[tuple[float, float]]] = {}
    for s in samples:
        by_request.setdefault(int(s["prompt_index"]), []).append((float(s["rm"]), float(s["judge"])))
    requests = list(by_request.values())
    n_replies = min(len(r) for r in requests)
    base_judge = sum(j for r in requests for _, j in r) / sum(len(r) for r in requests)
    base_rm = sum(x for r in requests for x, _ in r) / sum(len(r) for r in requests)
    points = []
    for beta in betas:
        kl = judge = rm = 0.0
        for replies in requests:
            top = max(x for x, _ in replies)
            weights = [math.exp((x - top) / beta) for x, _ in replies]  # the largest is 1: no overflow
            total = sum(weights)
            w = [v / total for v in weights]
            kl += sum(p * math.log(p * len(replies)) for p in w if p > 0)
            judge += sum(p * j for p, (_, j) in zip(w, replies))
            rm += sum(p * x for p, (x, _) in zip(w, replies))
        k = len(requests)
        points.append({"beta": beta, "kl": kl / k, "judge": judge / k, "rm": rm / k})
    return {"replies_per_request": n_replies, "base": {"judge": base_judge, "rm": base_rm}, "points": points}


def optimum_at(frontier: dict, kl: float, key: str = "judge") -> float | None:
    """The tilted policy's gain in ``key`` over the draw's mean at ``kl`` (piecewise linear in KL; None beyond
    the curve, which ends short of ``log N``)."""
    from demo.seed_stats import interpolate

    curve = [(0.0, 0.0)] + [(p["kl"], p[key] - frontier["base"][key]) for p in frontier["points"]]
    return interpolate(curve, kl)


def rm_scores(reward_model, prompts: list[str], responses: list[str]) -> list[float]:
    """The reward model's normalised scores of rendered prompts and their replies (the chat template's end of
    turn appended, as PPO's reward reads a cut reply)."""
    from rlhf_lit.evaluation.judges import judge_scores

    return judge_scores(reward_model, prompts, responses, "response", "cpu")


def evaluated_policies(demo: Path, reward_model) -> list[dict]:
    """Every policy in ``demo/eval`` beside the instruction model: its name, KL, judge gain over it and (with a
    ``reward_model``) its reward-model gain over it, on the same held-out requests."""

    def read(path: Path) -> dict:
        result = json.loads(path.read_text(encoding="utf-8"))
        row = {"kl": result["metrics"]["kl_mean"], "judge": result["metrics"]["judge_mean"]}
        if reward_model is not None:
            samples = result["samples"]
            scores = rm_scores(reward_model, [s["prompt_text"] for s in samples], [s["response"] for s in samples])
            row["rm"] = sum(scores) / len(scores)
        return row

    base = read(demo / "eval" / "instruction.json")
    rows = []
    for path in sorted((demo / "eval").glob("*.json")):
        if path.stem == "instruction":
            continue
        m = read(path)
        row = {"policy": path.stem, "kl": m["kl"], "judge_gain": m["judge"] - base["judge"]}
        if "rm" in m:
            row["rm_gain"] = m["rm"] - base["rm"]
        rows.append(row)
    return rows


def summarise(demo: Path, draw: Path | None, rescore: bool) -> dict:
    """The tilted frontier of one finished run, its policies against it, and PPO's training path; with
    ``rescore``, every reply (the draw's and the evaluations') scored again by the run's reward model here."""
    path = draw or demo / "best_of_n" / "best_of_n.json"
    if not path.exists():
        raise SystemExit(f"--demo {demo}: no {path} (not a finished `make demo-chat` folder)")
    run = json.loads(path.read_text(encoding="utf-8"))
    reward_model = None
    if rescore:
        from rlhf_lit.evaluation.judges import load_judge

        reward_model = load_judge(str(demo / "reward_model" / "model"))
        texts = run["prompt_texts"]
        scores = rm_scores(
            reward_model, [texts[s["prompt_index"]] for s in run["samples"]], [s["response"] for s in run["samples"]]
        )
        for s, score in zip(run["samples"], scores):
            s["rm"] = score
    frontier = tilted_frontier(run["samples"])
    policies = evaluated_policies(demo, reward_model)
    for row in policies:
        row["optimum_gain"] = optimum_at(frontier, row["kl"])
        row["share"] = row["judge_gain"] / row["optimum_gain"] if row["optimum_gain"] else None
        if "rm_gain" in row:
            row["optimum_rm_gain"] = optimum_at(frontier, row["kl"], "rm")
            row["rm_share"] = row["rm_gain"] / row["optimum_rm_gain"] if row["optimum_rm_gain"] else None
    return {"demo": str(demo), "draw": str(path), "frontier": frontier, "policies": policies}


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def main() -> None:
    """Print each run's tables and write the result file."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--demo", type=Path, action="append", required=True, help="a finished make demo-chat folder")
    parser.add_argument("--draw", type=Path, help="a best_of_n.json with more replies per request (one --demo)")
    parser.add_argument(
        "--rescore", action="store_true", help="score every reply with the run's reward model here (RM gains)"
    )
    args = parser.parse_args()
    if args.draw and len(args.demo) != 1:
        parser.error("--draw goes with exactly one --demo")
    runs = [summarise(demo, args.draw, args.rescore) for demo in args.demo]
    for run in runs:
        f = run["frontier"]
        print(f"\n{run['demo']}: {f['replies_per_request']} replies a request, judge {f['base']['judge']:.3f}")
        print("| beta | KL | judge gain | RM gain |\n|---|---|---|---|")
        for p in f["points"]:
            print(
                f"| {p['beta']} | {p['kl']:.2f} | {p['judge'] - f['base']['judge']:+.3f} | {p['rm'] - f['base']['rm']:+.3f} |"
            )
        print(
            "\n| policy | KL | judge gain | the optimum's at that KL | share | RM gain | the optimum's | share |"
            "\n|---|---|---|---|---|---|---|---|"
        )
        for r in run["policies"]:
            print(
                f"| {r['policy']} | {r['kl']:.2f} | {r['judge_gain']:+.3f} | {_f(r['optimum_gain'])} | {_f(r['share'], 2)} "
                f"| {_f(r.get('rm_gain'))} | {_f(r.get('optimum_rm_gain'))} | {_f(r.get('rm_share'), 2)} |"
            )
    write_result("chat-kl-optimum", {"runs": runs})


if __name__ == "__main__":
    main()

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
curve at its own KL: its judge gain over the instruction model (the evaluations' one reply a request, paired
by request, with its standard error), the optimum's gain at that KL (over the draw's mean), and the share of
it reached. The curve of N drawn replies lies below the optimum's own, the further out the more (a tilt of N
replies cannot leave them): a share is an upper bound, the looser the larger the KL. With ``--rescore`` every reply
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
        the draw's means (the mean over requests of each request's mean: the tilt at an infinite beta), then per
        beta the means over requests of the tilted policy's KL (nats), judge and rm.
    """
    by_request: dict[int, list[tuple[float, float]]] = {}
    for s in samples:
        by_request.setdefault(int(s["prompt_index"]), []).append((float(s["rm"]), float(s["judge"])))
    requests = list(by_request.values())
    n_replies = min(len(r) for r in requests)
    base_judge = sum(sum(j for _, j in r) / len(r) for r in requests) / len(requests)
    base_rm = sum(sum(x for x, _ in r) / len(r) for r in requests) / len(requests)
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


def paired_gain(policy: list[float], base: list[float]) -> tuple[float, float]:
    """Mean of ``policy[i] - base[i]`` over the requests and its standard error (sample std over sqrt(n)).

    The demo evaluates every policy with the same seed, one reply a request, so a policy's reply and the
    instruction model's to one request are drawn from the same random numbers: their difference varies less
    than either score."""
    from demo.seed_stats import mean_se

    mean, se = mean_se([p - b for p, b in zip(policy, base, strict=True)])
    return mean, float("nan") if se is None else se


def evaluated_policies(demo: Path, reward_model) -> list[dict]:
    """Every policy in ``demo/eval`` beside the instruction model: its name, KL, judge gain over the
    instruction model's evaluation (paired by request, :func:`paired_gain`, with its standard error) and, with a
    ``reward_model``, its reward-model gain the same way."""

    def read(result: dict) -> dict:
        samples = sorted(result["samples"], key=lambda s: s["prompt_index"])
        row = {"kl": result["metrics"]["kl_mean"], "judge": [float(s["judge"]) for s in samples]}
        if reward_model is not None:
            row["rm"] = rm_scores(reward_model, [s["prompt_text"] for s in samples], [s["response"] for s in samples])
        return row

    from demo.chat_report import read_evaluations

    evaluations = read_evaluations(demo)
    base = read(evaluations.pop("instruction"))
    rows = []
    for name, evaluation in evaluations.items():
        m = read(evaluation)
        row = {"policy": name, "kl": m["kl"]}
        row["judge_gain"], row["judge_gain_se"] = paired_gain(m["judge"], base["judge"])
        if "rm" in m:
            row["rm_gain"], row["rm_gain_se"] = paired_gain(m["rm"], base["rm"])
        rows.append(row)
    return rows


def against_the_optimum(frontier: dict, policies: list[dict]) -> None:
    """Add to each policy row the optimum's gain at its KL and the share of it the policy reached, with the
    share's standard error from the gain's (the optimum's own, from the draw, left out); None beyond the curve."""
    for row in policies:
        for key, gain in (("judge", "judge_gain"), ("rm", "rm_gain")):
            if gain not in row:
                continue
            prefix = "" if key == "judge" else "rm_"
            optimum = optimum_at(frontier, row["kl"], key)
            row[f"optimum_{prefix}gain"] = optimum
            row[f"{prefix}share"] = row[gain] / optimum if optimum else None
            row[f"{prefix}share_se"] = row[f"{gain}_se"] / optimum if optimum else None


def summarise(demo: Path, draw: Path | None, rescore: bool) -> dict:
    """The tilted frontier of one finished run and its policies against it; with ``rescore``, every reply (the
    draw's and the evaluations') scored again by the run's reward model here."""
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
    against_the_optimum(frontier, policies)
    return {"demo": str(demo), "draw": str(path), "frontier": frontier, "policies": policies}


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _pm(row: dict, key: str, digits: int = 3) -> str:
    """``row[key] +- row[key_se]``, or ``-`` when the row has none."""
    if row.get(key) is None:
        return "-"
    return f"{row[key]:+.{digits}f} +- {row[f'{key}_se']:.{digits}f}"


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
                f"| {r['policy']} | {r['kl']:.2f} | {_pm(r, 'judge_gain')} | {_f(r['optimum_gain'])} | {_pm(r, 'share', 2)} "
                f"| {_pm(r, 'rm_gain')} | {_f(r.get('optimum_rm_gain'))} | {_pm(r, 'rm_share', 2)} |"
            )
    write_result("chat-kl-optimum", {"runs": runs})


if __name__ == "__main__":
    main()

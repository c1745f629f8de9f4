"""Does the chat demo's reward pay a reply for not ending its turn? Read from a finished run's best-of-N draw.

    .venv/bin/python bench/chat_unfinished_bias.py --demo logs/chat_study/seed_1 --demo logs/chat_study/seed_2

A finished ``make demo-chat`` folder keeps every reply its best-of-N stage drew (``best_of_n/best_of_n.json``:
N replies of the instruction model to each of 128 held-out requests, each with its reward-model score, its
judge score and whether it ended with the turn's end token before ``max_new_tokens``). Within each request
that has replies of both kinds, the mean score of the replies that ended minus the mean score of the cut
ones; then the mean of that difference over those requests, with its standard error. Within a request, so
that what a request asks for (some requests draw short answers, some long ones) does not enter. A negative
difference says the score prefers a cut, longer reply to a finished one of the same request: PPO, which
climbs that score, then learns to end its turn less often.

Reads only; writes ``bench/results/chat-unfinished-bias-<UTC date>[-N].json``.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

from results_file import write_result


def ended_minus_cut(samples: list[dict], key: str) -> dict:
    """Mean over requests (``prompt_index``) with ended and cut replies of ``mean(key | ended) - mean(key | cut)``.

    Args:
        samples: best-of-N samples, each a dict with ``prompt_index``, ``ended`` (bool) and ``key``.
        key: the value to compare (``rm``, ``judge`` or ``length`` in tokens).

    Returns:
        ``{"requests": n, "mean": d, "stderr": s}`` (``stderr`` the sample standard deviation of the
        per-request differences over sqrt(n); None below 2 requests, ``mean`` None at 0).
    """
    by_request: dict[int, dict[bool, list[float]]] = defaultdict(lambda: {True: [], False: []})
    for sample in samples:
        by_request[sample["prompt_index"]][bool(sample["ended"])].append(float(sample[key]))
    diffs = [
        sum(kinds[True]) / len(kinds[True]) - sum(kinds[False]) / len(kinds[False])
        for kinds in by_request.values()
        if kinds[True] and kinds[False]
    ]
    n = len(diffs)
    mean = sum(diffs) / n if n else None
    stderr = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n) if n >= 2 else None
    return {"requests": n, "mean": mean, "stderr": stderr}


def summarise(demo: Path) -> dict:
    """The reward model's and the judge's preference between ended and cut replies in one finished run, how
    much shorter the ended ones are, and best-of-N's share of replies that end at each N."""
    path = demo / "best_of_n" / "best_of_n.json"
    if not path.exists():
        raise SystemExit(f"--demo {demo}: no best_of_n/best_of_n.json (not a finished `make demo-chat` folder)")
    run = json.loads(path.read_text(encoding="utf-8"))
    samples = run["samples"]
    return {
        "demo": str(demo),
        "samples": len(samples),
        "ended_fraction": sum(bool(s["ended"]) for s in samples) / len(samples),
        "rm": ended_minus_cut(samples, "rm"),
        "judge": ended_minus_cut(samples, "judge"),
        "length": ended_minus_cut(samples, "length"),
        "best_of_n_ended": {row["n"]: row["ended_fraction"] for row in run["rows"]},
    }


def main(argv: list[str] | None = None) -> int:
    """Summarise each ``--demo`` folder, print it and write the result file."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--demo", type=Path, action="append", required=True, help="a finished chat demo folder")
    args = p.parse_args(argv)
    runs = [summarise(demo) for demo in args.demo]
    for run in runs:
        print(
            f"{run['demo']}: {run['samples']} replies, {run['ended_fraction']:.3f} ended; ended minus cut within a "
            f"request: reward model {run['rm']['mean']:+.3f} +- {run['rm']['stderr']:.3f}, judge "
            f"{run['judge']['mean']:+.3f} +- {run['judge']['stderr']:.3f}, length {run['length']['mean']:+.1f} tokens "
            f"({run['rm']['requests']} requests); "
            f"best-of-N's share that ends by N: {run['best_of_n_ended']}"
        )
    write_result("chat-unfinished-bias", {"runs": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

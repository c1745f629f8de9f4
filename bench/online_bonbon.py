"""Online BoNBoN on the offline demo: ``rlhf-lit iterate`` with ``policy: bonbon`` from a finished demo's SFT
model, ranked by its reward model, measured on its held-out prompts beside a best-of-N sweep.

    OMP_NUM_THREADS=1 .venv/bin/python bench/online_bonbon.py --demo logs/demo --out runs/online_bonbon \\
        --k 4 --iterations 3 --per-iteration 320 --seed 0 --best-of-n logs/seeds/best_of_n/seed_0/best_of_n.json

1. **prompts** (``<out>/prompts.jsonl``): the demo's 256 held-out prompts first (its ``eval`` paragraphs, the
   first 8 words, as ``python -m demo evaluate`` reads them: every iteration's evaluation set), then the
   paragraphs after every demo range (no demo stage trains on them), ``--per-iteration`` fresh ones an
   iteration;
2. **the loop** (``<out>/loop.yaml``, ``<out>/bonbon_stage.yaml``): K samples per prompt from the current
   policy (48 new tokens at temperature 1, as every demo policy is evaluated), the best and the worst by the
   demo's reward model, BoNBoN with ``configs/demo/bonbon.yaml``'s settings (its logger and export folder
   left to the loop) from the current policy; the loop's summary scores each policy with the VADER judge and
   its KL to the SFT model on the held-out prompts;
3. **the comparison**: with ``--best-of-n`` (an ``rlhf-lit best-of-n`` sweep result on the same prompts, e.g.
   ``python -m demo seeds --best-of-n 64``'s), each iteration's judge minus the sweep's curve at its KL
   (analytic KL of best-of-N, interpolated; none beyond the sweep's largest N).

Writes ``bench/results/online-bonbon-<UTC date>[-N].json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml
from results_file import write_result

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the demo's package, beside rlhf_lit in a clone

from demo.seed_stats import interpolate  # noqa: E402
from demo.seeds_report import best_of_n_curve  # noqa: E402
from demo.story_prompts import RANGES, opening_words, read_paragraphs  # noqa: E402
from rlhf_lit.child_runs import rlhf_lit_command, run  # noqa: E402
from rlhf_lit.integrity import check_json_file  # noqa: E402

PARAGRAPHS = ROOT / "assets" / "data" / "tinystories" / "val.txt"
JUDGE = "rlhf_lit.evaluation.judges:vader"


def write_prompts(path: Path, paragraphs: Path = PARAGRAPHS) -> tuple[int, int]:
    """The demo's held-out prompts, then the openings of the paragraphs after every demo range, one JSON
    record each; ``(held-out, fresh)`` counts."""
    texts = read_paragraphs(str(paragraphs))
    start, count = RANGES["eval"]
    after = max(s + c for s, c in RANGES.values())
    held, fresh = texts[start : start + count], texts[after:]
    with open(path, "w", encoding="utf-8") as f:
        for text in held + fresh:
            f.write(json.dumps({"prompt": opening_words(text, 8)}) + "\n")
    return len(held), len(fresh)


def stage_config(path: Path) -> None:
    """``configs/demo/bonbon.yaml`` without its logger and export folder (the loop puts them under its run)."""
    config = yaml.safe_load((ROOT / "configs" / "demo" / "bonbon.yaml").read_text(encoding="utf-8"))
    config["trainer"].pop("logger", None)
    config["model"]["init_args"].pop("export_dir", None)
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")


def loop_config(args: argparse.Namespace, out: Path, held: int) -> dict:
    """The ``rlhf-lit iterate`` config of the run."""
    return {
        "run_dir": str(out / "run"),
        "iterations": args.iterations,
        "seed": args.seed,
        "sft_model": str(args.demo / "sft" / "model"),
        "policy": "bonbon",
        "prompts": {"path": str(out / "prompts.jsonl"), "held_out": held, "per_iteration": args.per_iteration},
        "sampling": {"responses_per_prompt": args.k, "max_new_tokens": 48, "temperature": 1.0, "batch_size": 64},
        "labeler": {"kind": "reward_model", "source": str(args.demo / "reward_model" / "model")},
        "bonbon": {"config": str(out / "bonbon_stage.yaml"), "options": list(args.bonbon_args)},
        "evaluation": {"judge": JUDGE},
    }


def below_best_of_n(rows: list[dict], sweep: dict | None) -> list[dict]:
    """Each summary row's ``(iteration, judge, kl)`` and, against ``sweep``, its judge minus best-of-N's at its KL."""
    curve = best_of_n_curve(sweep) if sweep is not None else []
    out = []
    for row in rows:
        at = interpolate(curve, max(row["kl"], 0.0)) if curve else None
        gap = None if at is None else row["gold"] - at
        out.append({"iteration": row["iteration"], "judge": row["gold"], "kl": row["kl"], "minus_best_of_n": gap})
    return out


def main(argv: list[str] | None = None) -> int:
    """Write the prompts and configs, run the loop, write the result."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--demo", type=Path, required=True, help="a finished `make demo` folder")
    p.add_argument("--out", type=Path, required=True, help="a new folder for the loop's run")
    p.add_argument("--k", type=int, default=4, help="samples per prompt: BoNBoN's N (default: %(default)s)")
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--per-iteration", type=int, default=320, help="fresh prompts an iteration")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--best-of-n", type=Path, default=None, help="a best-of-N sweep result on the held-out prompts")
    p.add_argument("--bonbon-args", nargs="*", default=[], help="more BoNBoN fit options")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=False)
    held, fresh = write_prompts(args.out / "prompts.jsonl")
    if args.iterations * args.per_iteration > fresh:
        raise SystemExit(f"{args.iterations} x {args.per_iteration} fresh prompts needed, {fresh} there")
    stage_config(args.out / "bonbon_stage.yaml")
    config = loop_config(args, args.out, held)
    (args.out / "loop.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    status = run(rlhf_lit_command(["iterate", "--config", str(args.out / "loop.yaml")]), args.out / "loop.log")
    if status != 0:
        raise SystemExit(f"rlhf-lit iterate failed (exit status {status}): {args.out / 'loop.log'}")
    summary = check_json_file(args.out / "run" / "summary.json")
    sweep = check_json_file(args.best_of_n) if args.best_of_n else None
    rows = below_best_of_n(summary["rows"], sweep)
    write_result("online-bonbon", {"config": config, "rows": rows, "timing_s": summary["timing_s"]})
    for row in rows:
        gap = "-" if row["minus_best_of_n"] is None else f"{row['minus_best_of_n']:+.3f}"
        print(f"iteration {row['iteration']}: judge {row['judge']:.3f} at {row['kl']:.2f} nats, minus best-of-N {gap}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

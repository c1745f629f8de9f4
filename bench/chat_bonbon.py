"""BoNBoN on the chat demo: best-of-N distillation of SmolLM2-135M-Instruct at several N, against a finished
run's best-of-N, DPO and instruction model on its held-out requests.

    OMP_NUM_THREADS=2 .venv/bin/python bench/chat_bonbon.py --demo logs/chat_study/seed_0 --ns 4,8,16 \\
        --prompts 256 --seed 0

1. **the run**: ``--demo`` is a folder ``make demo-chat`` (or ``python -m demo.chat_seeds``) wrote; its PPO
   requests (``data/ppo.jsonl``: training requests, never held out), its held-out requests, its reward model,
   its best-of-N sweep (``best_of_n/best_of_n.json``) and its evaluations are read, never written;
2. **the samples**: one ``rlhf-lit best-of-n`` run draws the largest N replies of the instruction model for
   each of the first ``--prompts`` PPO requests, at the demo's sampling settings, each scored by the reward
   model as PPO's reward reads a cut reply; the pairs of each N are the best and the worst of each request's
   FIRST N of them (:func:`~rlhf_lit.evaluation.best_of_n_pairs.best_worst_pairs`): the first N of
   independent draws are N independent draws, so one sampling run serves every N;
3. **the fits**: ``configs/demo_chat/bonbon.yaml`` once per N (beta derived from N), at the run's precision
   and ``--seed``;
4. **the evaluation**: each BoNBoN export on the held-out requests as the demo evaluates its policies (one
   reply each, seed 0): judge mean +- s.e., KL to the instruction model, distinct-2, the share that end their
   turn; then its judge mean minus the run's best-of-N curve (the instruction model at KL 0, best-of-N at its
   analytic KL) and minus DPO, both read at BoNBoN's KL (None beyond the curve).

Compute is recorded per N: samples drawn and reward-model passes (P x N: the pairs of N use only the first N
of each request's samples), the fit's seconds. Writes ``bench/results/chat-bonbon-<UTC date>[-N].json``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

from results_file import write_result

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the demo's package, beside rlhf_lit in a clone

CONFIG = ROOT / "configs" / "demo_chat" / "bonbon.yaml"
WRITTEN_BY = "bench/chat_bonbon.py"


def parse_ns(text: str) -> tuple[int, ...]:
    """``"16,4,8"`` -> ``(4, 8, 16)``: the demo's N parser (:func:`demo.seeds_bonbon.parse_ns`), sorted: the
    largest N is how many replies a request gets drawn."""
    from demo.seeds_bonbon import parse_ns as demo_ns

    return tuple(sorted(demo_ns(text)))


def finished_run(demo: Path) -> dict:
    """What this bench reads of a finished chat demo run: what PPO's variant bench reads
    (:func:`chat_ppo_variants.finished_run`) and the run's best-of-N sweep (exits naming what is missing)."""
    from chat_ppo_variants import finished_run as demo_run

    run = demo_run(demo)
    sweep = demo / "best_of_n" / "best_of_n.json"
    if not sweep.exists():
        raise SystemExit(f"--demo {demo}: no {sweep.relative_to(demo)} (not a finished `make demo-chat` folder)")
    return {**run, "best_of_n": sweep, "sweep": json.loads(sweep.read_text(encoding="utf-8"))}


def first_requests(source: Path, count: int, out: Path) -> list:
    """The first ``count`` requests of a prompts JSONL (each record's ``prompt``), also written to ``out``."""
    lines = [line for line in source.read_text(encoding="utf-8").splitlines() if line.strip()][:count]
    if len(lines) < count:
        raise SystemExit(f"--prompts {count}: {source} has only {len(lines)} requests")
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return [json.loads(line)["prompt"] for line in lines]


def sampling_command(model: str, run: dict, prompts: Path, n_max: int, seed: int, out: Path) -> list[str]:
    """``rlhf-lit best-of-n``: ``n_max`` replies per request from the instruction model, scored by the run's
    reward model as PPO reads a cut reply, at the demo's sampling settings and the run's precision."""
    from demo.chat_plan import CHAT_FULL, CONFIGS, sampling_options
    from demo.plan import ppo_unfinished
    from rlhf_lit.child_runs import rlhf_lit_command

    return rlhf_lit_command(
        [
            "best-of-n",
            "--policy",
            model,
            "--reward-model",
            str(run["reward_model"]),
            "--prompts",
            str(prompts),
            "--n",
            str(n_max),
            *sampling_options(CHAT_FULL),
            "--seed",
            str(seed),
            "--unfinished",
            ppo_unfinished(CONFIGS / "ppo.yaml"),
            "--precision",
            run["precision"],
            "--out",
            str(out),
        ]
    )


def write_pairs(prompts: list, samples: list[dict], m: int, n: int, scored_by: str, path: Path) -> dict:
    """The best and the worst of each request's first ``n`` of its ``m`` samples by the reward model, as
    BoNBoN's pairs file; what was written and left out."""
    from rlhf_lit.artifacts import write_jsonl_atomically
    from rlhf_lit.evaluation.best_of_n_pairs import best_worst_pairs

    records, tied, empty = best_worst_pairs(prompts, samples, m, n, "rm", scored_by, written_by=WRITTEN_BY)
    write_jsonl_atomically(path, records)
    return {"written": len(records), "tied": tied, "empty": empty}


def fit_command(model: str, run: dict, pairs: Path, folder: Path, seed: int) -> list[str]:
    """``rlhf-lit fit`` of ``configs/demo_chat/bonbon.yaml`` on ``pairs``, its export in ``<folder>/model``."""
    from demo.runner import fit_command as fit

    return fit(
        CONFIG,
        [
            "--seed_everything",
            str(seed),
            "--trainer.logger.init_args.save_dir",
            str(folder),
            "--model.init_args.model",
            model,
            "--model.init_args.export_dir",
            str(folder / "model"),
            "--data.init_args.train_path",
            str(pairs),
            "--trainer.precision",
            run["precision"],
        ],
    )


def run_logged(cmd: list[str], log_path: Path, threads: int) -> float:
    """Run ``cmd`` with ``threads`` torch threads, its output to ``log_path``; seconds (exits on failure)."""
    from demo.runner import child_env

    print("$", shlex.join(cmd), flush=True)
    t0 = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        code = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=child_env(threads)).returncode
    if code != 0:
        raise SystemExit(f"exit status {code}; see {log_path}")
    return time.perf_counter() - t0


def evaluate(model: str, run: dict, policy: Path, threads: int) -> dict:
    """One reply per held-out request from ``policy``, measured as the demo measures its policies."""
    import torch

    from demo.chat_report import evaluate_as_the_demo
    from rlhf_lit.data.prompt_source import read_prompt_source
    from rlhf_lit.evaluation.judges import load_judge

    torch.set_num_threads(threads)
    prompts = read_prompt_source(str(run["eval_prompts"])).prompts
    judge = load_judge("rlhf_lit.evaluation.judges:vader")
    result = evaluate_as_the_demo(str(policy), prompts, model, judge, run["precision"])
    return result["metrics"] | {"sampling": result["config"]["sampling"]}


def margins(run: dict, metrics: dict) -> dict[str, float | None]:
    """``metrics``' judge mean minus best-of-N's curve and minus each DPO policy's curve point, at its KL:
    best-of-N's curve is the instruction model at KL 0, then each N of the run's sweep at its analytic KL; a
    DPO policy's is the straight line from the instruction model to it. None outside a curve's range."""
    from demo.seed_stats import interpolate

    base = (0.0, run["base"]["judge_mean"])
    bon = [base] + [(row["kl_analytic"], row["judge_mean"]) for row in run["sweep"]["rows"] if row["n"] > 1]
    out = {}
    at = interpolate(bon, metrics["kl_mean"])
    out["best_of_n"] = None if at is None else metrics["judge_mean"] - at
    for name, dpo in run["dpo"].items():
        at = interpolate([base, (dpo["kl_mean"], dpo["judge_mean"])], metrics["kl_mean"])
        out[name] = None if at is None else metrics["judge_mean"] - at
    return out


def main(argv: list[str] | None = None) -> int:
    """Draw the samples once, fit and evaluate BoNBoN at each N, print the table, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--demo", required=True, help="a finished `make demo-chat` folder (read only)")
    p.add_argument("--model", default=None, help="SmolLM2-135M-Instruct folder (default: make smollm2's cache)")
    p.add_argument("--out", default="runs/chat_bonbon", help="where the samples, pairs and fits go (a new folder)")
    p.add_argument("--ns", type=parse_ns, default=(4, 8, 16), help="the N of each BoNBoN fit, e.g. 4,8,16")
    p.add_argument("--prompts", type=int, default=256, help="PPO training requests the samples are drawn for")
    p.add_argument("--seed", type=int, default=0, help="the sampling's and the fits' seed (the run's own)")
    p.add_argument("--threads", type=int, default=2, help="torch threads of each step (it runs alone)")
    args = p.parse_args(argv)
    from demo.chat_plan import fetched_model
    from demo.chat_report import standard_error

    model = args.model or fetched_model()
    run = finished_run(Path(args.demo))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=False)  # a new folder: never over an earlier run's
    prompts = first_requests(run["ppo_prompts"], args.prompts, out / "prompts.jsonl")
    m = args.ns[-1]
    drawn = out / "samples.json"
    sampling_s = run_logged(
        sampling_command(model, run, out / "prompts.jsonl", m, args.seed, drawn), out / "samples.log", args.threads
    )
    samples = json.loads(drawn.read_text(encoding="utf-8"))["samples"]
    scored_by = f"reward_model {run['reward_model']}"
    print(
        f"instruction model: judge {run['base']['judge_mean']:.3f}; sampled {len(samples)} replies in {sampling_s:.0f} s"
    )
    per_n = {}
    for n in args.ns:
        folder = out / f"n_{n}"
        folder.mkdir()
        pairs = write_pairs(prompts, samples, m, n, scored_by, folder / "pairs.jsonl")
        fit_s = run_logged(
            fit_command(model, run, folder / "pairs.jsonl", folder, args.seed), folder / "fit.log", args.threads
        )
        metrics = evaluate(model, run, folder / "model", args.threads)
        gaps = margins(run, metrics)
        compute = {"samples": len(prompts) * n, "rm_passes": len(prompts) * n, "fit_seconds": fit_s}
        per_n[str(n)] = {"pairs": pairs, "metrics": metrics, "minus": gaps, "compute": compute}
        print(
            f"BoNBoN N={n}: judge {metrics['judge_mean']:.3f} +- {standard_error(metrics):.3f}, KL "
            f"{metrics['kl_mean']:.2f}, distinct-2 {metrics['distinct_2']:.3f}, ends its turn "
            f"{metrics['ended_fraction']:.3f}; minus best-of-N / DPO at its KL: {gaps}; fit {fit_s:.0f} s",
            flush=True,
        )
    fields = {
        "demo": str(args.demo),
        "seed": args.seed,
        "prompts": args.prompts,
        "precision": run["precision"],
        "sampling_seconds": sampling_s,
        "instruction_model": run["base"],
        "best_of_n": run["sweep"]["rows"],
        "dpo": run["dpo"],
        "bonbon": per_n,
    }
    write_result("chat-bonbon", fields)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""DPO of the chat demo at more betas on a finished run's pairs: where each lands on the judge-against-KL plane,
and PPO against DPO at equal KL read both ways.

    OMP_NUM_THREADS=2 .venv/bin/python bench/chat_dpo_betas.py --demo logs/chat_study/seed_0 --seed 0 \\
        --betas 0.03,0.01 --out runs/dpo_betas_s0
    # DPO further out: three epochs (the learning rate's linear decay spread over them) at the demo's beta
    ... --betas 0.1 --options "--trainer.max_epochs 3" --out runs/dpo_3_epochs

1. **the run**: ``--demo`` is a folder ``make demo-chat`` wrote; its best-vs-worst pairs (``prefs/pairs.jsonl``),
   held-out requests (``data/eval.jsonl``) and its evaluations of the instruction model, PPO (its
   checkpoints and export) and DPO (``eval/*.json``) are read, never written;
2. **DPO per beta**: the demo's own DPO stage (:func:`demo.chat_plan.dpo_command`, ``configs/demo_chat/dpo.yaml``)
   at each ``--betas`` value, on ``--device``, each under ``--out``, with ``--options`` (more ``rlhf-lit fit``
   options, split as a shell line) appended to each;
3. **evaluation** as the demo evaluates its policies (one reply per held-out request at PPO's sampling
   settings, seed 0, the run's precision); then PPO against DPO at equal KL both ways: PPO's curve (the
   instruction model at KL 0, its checkpoints, its export) at each DPO policy's KL minus that policy's judge
   mean (the demo's floor), and PPO's export minus DPO's curve (the instruction model and every DPO policy)
   at PPO's KL; never extrapolated.

Writes ``bench/results/chat-dpo-betas-<UTC date>[-N].json`` (a new name, never over an earlier run).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from results_file import write_result

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the demo's package, beside rlhf_lit in a clone

from demo.chat_plan import CHAT_FULL, CHAT_TINY, DEVICES, default_model, dpo_command, on_device  # noqa: E402
from demo.plan import Paths, parse_betas  # noqa: E402
from demo.seed_stats import interpolate  # noqa: E402


def demo_points(demo: Path) -> dict:
    """The demo's own evaluations: the instruction model's judge mean, PPO's curve (KL, judge) and DPO's points."""
    from demo.chat_report import read_evaluations

    evals = {name: evaluation["metrics"] for name, evaluation in read_evaluations(demo).items()}
    point = lambda m: (m["kl_mean"], m["judge_mean"])  # noqa: E731
    rollouts = sorted((int(k[len("ppo_rollout") :]), k) for k in evals if k.startswith("ppo_rollout"))
    ppo_curve = [
        (0.0, evals["instruction"]["judge_mean"]),
        *(point(evals[k]) for _, k in rollouts),
        point(evals["ppo"]),
    ]
    dpo = {k[len("dpo_beta_") :]: point(m) for k, m in evals.items() if k.startswith("dpo_beta_")}
    return {"instruction": evals["instruction"]["judge_mean"], "ppo_curve": ppo_curve, "dpo": dpo}


def equal_kl(instruction: float, ppo_curve: list[tuple[float, float]], dpo: dict[str, tuple[float, float]]) -> dict:
    """PPO against DPO at equal KL both ways (None where the other curve does not reach; never extrapolated)."""
    at_dpo = {}
    for beta, (kl, judge) in dpo.items():
        at = interpolate(ppo_curve, kl)
        at_dpo[beta] = None if at is None else at - judge
    ppo_kl, ppo_judge = ppo_curve[-1]
    dpo_at_ppo = interpolate([(0.0, instruction), *sorted(dpo.values())], ppo_kl)
    return {
        "ppo_curve_minus_dpo_at_dpo_kl": at_dpo,
        "ppo_minus_dpo_curve_at_ppo_kl": None if dpo_at_ppo is None else ppo_judge - dpo_at_ppo,
    }


def fit_and_evaluate(args: argparse.Namespace, model: str, beta: float) -> dict:
    """DPO at ``beta`` on the demo's pairs (its folder under ``--out``), then the demo's evaluation of it."""
    from demo.chat_report import evaluate_as_the_demo
    from rlhf_lit.data.prompt_source import read_prompt_source
    from rlhf_lit.evaluation.judges import load_judge

    paths = Paths(args.out.absolute())
    results = json.loads((args.demo / "results.json").read_text(encoding="utf-8"))
    precision = results["precision"]
    t0 = time.perf_counter()
    budget = CHAT_TINY if args.tiny else CHAT_FULL
    cmd = on_device(dpo_command(model, paths, budget, beta, args.seed, precision), args.device)
    cmd += shlex.split(args.options)
    stage = f"dpo/beta_{beta:g}"
    log = paths.root / f"{stage.replace('/', '_')}.log"
    with open(log, "w", encoding="utf-8") as out:
        if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
            raise SystemExit(f"DPO at beta {beta:g} failed; its log: {log}")
    fit_s = time.perf_counter() - t0
    prompts = read_prompt_source(str(args.demo / "data" / "eval.jsonl")).prompts
    judge = load_judge(args.judge)
    result = evaluate_as_the_demo(str(paths.model(stage)), prompts, model, judge, precision, args.device, budget)
    m = result["metrics"]
    keys = ("judge_mean", "judge_std", "kl_mean", "distinct_2", "length_mean", "ended_fraction", "num_samples")
    row = {"beta": beta, "options": args.options, "fit_s": fit_s, **{k: m[k] for k in keys}}
    print(
        f"DPO beta {beta:g} {args.options}: judge {m['judge_mean']:.3f} at KL {m['kl_mean']:.2f}; fit {fit_s:.0f} s",
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> int:
    """Fit and evaluate DPO at each beta, compare with the demo's PPO both ways, write the result."""
    from rlhf_lit.evaluation.judges import DEFAULT_JUDGE

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--demo", required=True, type=Path, help="a finished chat-demo folder")
    p.add_argument(
        "--seed",
        type=int,
        required=True,
        help="DPO's seed_everything (it draws nothing in DPO: the data's seed does, --options '--data.init_args.seed N')",
    )
    p.add_argument("--betas", type=parse_betas, required=True, metavar="B,B,...")
    p.add_argument("--out", required=True, type=Path, help="a new folder for the DPO runs")
    p.add_argument(
        "--options",
        default="",
        help="more rlhf-lit fit options for every DPO fit, split as a shell line (e.g. '--trainer.max_epochs 3')",
    )
    p.add_argument("--model", default=None, help="SmolLM2-135M-Instruct folder (default: make smollm2's cache)")
    p.add_argument("--device", choices=DEVICES, default="cpu")
    p.add_argument("--judge", default=DEFAULT_JUDGE)
    p.add_argument("--tiny", action="store_true", help="the demo's smoke-test budget (for a --tiny folder)")
    args = p.parse_args(argv)
    if args.out.exists():
        raise SystemExit(f"--out {args.out} exists; name a new folder")
    model = args.model or default_model()
    before = demo_points(args.demo)
    (args.out / "prefs").mkdir(parents=True)
    shutil.copyfile(args.demo / "prefs" / "pairs.jsonl", args.out / "prefs" / "pairs.jsonl")
    rows = [fit_and_evaluate(args, model, beta) for beta in args.betas]
    label = lambda beta: f"{beta:g} {args.options}".strip()  # noqa: E731  (never the demo's own beta's key)
    dpo = {**before["dpo"], **{label(r["beta"]): (r["kl_mean"], r["judge_mean"]) for r in rows}}
    comparison = equal_kl(before["instruction"], before["ppo_curve"], dpo)
    print(json.dumps(comparison, indent=1))
    fields = {"demo": str(args.demo), "seed": args.seed, "device": args.device, "rows": rows}
    write_result("chat-dpo-betas", {**fields, "ppo_curve": before["ppo_curve"], "dpo": dpo, **comparison})
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""PPO variants of the chat demo against a finished run's reward model: where each one's checkpoints land
on the judge-against-KL plane, beside that run's DPO (which PPO must match at equal KL).

    OMP_NUM_THREADS=2 .venv/bin/python bench/chat_ppo_variants.py --demo logs/demo_chat \\
        --variant "shipped=" --variant "kl0.2=--model.init_args.kl.init_coef 0.2"

1. **the run**: ``--demo`` is a folder ``make demo-chat`` wrote; its PPO requests (``data/ppo.jsonl``),
   its held-out requests (``data/eval.jsonl``), its reward model (``reward_model/model``) and its
   evaluations of the instruction model and of DPO (``eval/*.json``) are read, never written;
2. **variants**: one PPO fit per ``--variant NAME=OPTIONS`` (``configs/demo_chat/ppo.yaml`` as the demo
   runs it, then the extra fit options; empty: the shipped recipe), a checkpoint every
   ``--checkpoint-every`` rollouts, each in its own folder under ``--out``;
3. **evaluation**: every checkpoint on the held-out requests as the demo evaluates its policies
   (:func:`rlhf_lit.evaluation.policy_metrics.evaluate_policy`, one reply each at PPO's sampling settings,
   seed 0, at the run's precision): judge mean ± s.e., KL to the instruction model, the share of replies
   that end their turn; and the variant's curve interpolated at each DPO policy's KL, minus DPO's judge
   mean (the demo's floor, :func:`demo.chat_report.check_floors`).

Writes ``bench/results/chat-ppo-variants-<UTC date>[-N].json`` (a new name, never over an earlier run).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from chat_reward_model import parse_variant
from results_file import write_result

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the demo's package, beside rlhf_lit in a clone


def demo_files(demo: Path, **relative: str) -> dict[str, Path]:
    """``{name: demo / path}`` for each ``name=path`` of a finished chat demo folder that a bench reads; exits
    with a message naming the first one missing."""
    wanted = {name: demo / path for name, path in relative.items()}
    for path in wanted.values():
        if not path.exists():
            raise SystemExit(f"--demo {demo}: no {path.relative_to(demo)} (not a finished `make demo-chat` folder)")
    return wanted


def finished_run(demo: Path) -> dict:
    """What this bench reads of a finished chat demo run (exits with a message when something is missing)."""
    wanted = demo_files(
        demo,
        ppo_prompts="data/ppo.jsonl",
        eval_prompts="data/eval.jsonl",
        reward_model="reward_model/model",
        instruction="eval/instruction.json",
        results="results.json",
    )
    results = json.loads(wanted["results"].read_text(encoding="utf-8"))
    dpo = {p.stem: json.loads(p.read_text(encoding="utf-8"))["metrics"] for p in sorted(demo.glob("eval/dpo_*.json"))}
    base = json.loads(wanted["instruction"].read_text(encoding="utf-8"))["metrics"]
    return {**wanted, "precision": results["precision"], "base": base, "dpo": dpo}


def fit_variant(
    model: str, run: dict, options: list[str], folder: Path, checkpoint_every: int, seed: int | None
) -> float:
    """PPO of one variant as the demo runs it (its config, its reward model, its requests, the run's
    ``--seed``: None for the configs' own); seconds."""
    from demo.chat_plan import CHAT_FULL, ppo_command
    from demo.plan import Paths
    from demo.runner import child_env

    paths = Paths(folder)
    paths.dir("data").mkdir(parents=True)
    shutil.copyfile(run["ppo_prompts"], paths.dir("data") / "ppo.jsonl")  # ppo_command reads it there
    budget = replace(CHAT_FULL, checkpoint_every=checkpoint_every)
    judge = "rlhf_lit.evaluation.judges:vader"
    cmd = ppo_command(model, paths, budget, judge, seed, run["precision"])
    cmd += ["--model.init_args.reward_model", str(run["reward_model"].absolute()), *options]
    print("$", shlex.join(cmd), flush=True)
    t0 = time.perf_counter()
    with open(folder / "ppo.log", "w", encoding="utf-8") as log:
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=log, stderr=subprocess.STDOUT, env=child_env(budget.threads))
    return time.perf_counter() - t0


def evaluate_checkpoints(model: str, run: dict, folder: Path) -> dict[int, dict]:
    """Every rollout checkpoint of a variant on the held-out requests: ``{rollout: metrics}``."""
    import torch

    from demo.chat_plan import CHAT_FULL
    from demo.chat_report import evaluate_as_the_demo
    from demo.frontier import export_checkpoint_policy
    from demo.plan import Paths
    from rlhf_lit.data.prompt_source import read_prompt_source
    from rlhf_lit.evaluation.judges import load_judge
    from rlhf_lit.models.checkpoint_policy import rollout_checkpoints

    torch.set_num_threads(CHAT_FULL.threads)
    prompts = read_prompt_source(str(run["eval_prompts"])).prompts
    judge = load_judge("rlhf_lit.evaluation.judges:vader")
    checkpoints = Paths(folder).checkpoints
    measured = {}
    for rollout, ckpt in sorted(rollout_checkpoints(str(checkpoints)).items()):
        policy = export_checkpoint_policy(ckpt, model, str(checkpoints / f"rollout={rollout}"))
        result = evaluate_as_the_demo(policy, prompts, model, judge, run["precision"])
        measured[rollout] = result["metrics"] | {"sampling": result["config"]["sampling"]}
    return measured


def against_dpo(base: dict, measured: dict[int, dict], dpo: dict[str, dict]) -> dict[str, float | None]:
    """The variant's curve (the instruction model at KL 0, then its checkpoints) interpolated at each DPO
    policy's KL, minus that policy's judge mean; None where the curve does not reach that KL."""
    from demo.seeds_report import interpolate

    curve = [(0.0, base["judge_mean"])] + [(m["kl_mean"], m["judge_mean"]) for _, m in sorted(measured.items())]
    margins = {}
    for name, metrics in dpo.items():
        at = interpolate(curve, metrics["kl_mean"])
        margins[name] = None if at is None else at - metrics["judge_mean"]
    return margins


def main(argv: list[str] | None = None) -> int:
    """Fit and evaluate every variant, print each one's curve, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--demo", required=True, help="a finished `make demo-chat` folder (read only)")
    p.add_argument("--model", default=None, help="SmolLM2-135M-Instruct folder (default: make smollm2's cache)")
    p.add_argument("--out", default="runs/chat_ppo", help="where the variants' fits go (a new folder)")
    p.add_argument("--checkpoint-every", type=int, default=4, help="rollouts between evaluated checkpoints")
    p.add_argument(
        "--variant",
        type=parse_variant,
        action="append",
        required=True,
        metavar="NAME=OPTIONS",
        help="one PPO fit: OPTIONS are split as a shell line, so a JSON value needs its own quotes",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="the --seed the run was made with (a `python -m demo.chat_seeds` folder seed_N: N); default: the configs' own",
    )
    args = p.parse_args(argv)
    from demo.chat_plan import fetched_model
    from demo.chat_report import standard_error

    model = args.model or fetched_model()
    run = finished_run(Path(args.demo))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=False)  # a new folder: never over an earlier run's
    print(f"instruction model: judge {run['base']['judge_mean']:.3f}")
    for name, metrics in run["dpo"].items():
        print(f"{name}: judge {metrics['judge_mean']:.3f} at KL {metrics['kl_mean']:.2f}")
    variants = {}
    for name, options in args.variant:
        seconds = fit_variant(model, run, options, out / name, args.checkpoint_every, args.seed)
        measured = evaluate_checkpoints(model, run, out / name)
        margins = against_dpo(run["base"], measured, run["dpo"])
        variants[name] = {"options": options, "fit_seconds": seconds, "rollouts": measured, "minus_dpo": margins}
        for rollout, m in measured.items():
            print(
                f"{name} rollout {rollout}: judge {m['judge_mean']:.3f} +- {standard_error(m):.3f}, "
                f"KL {m['kl_mean']:.2f}, ends its turn {m['ended_fraction']:.3f}",
                flush=True,
            )
        print(f"{name}: minus DPO at equal KL: {margins}; fit {seconds:.0f} s", flush=True)
    fields = {
        "demo": str(args.demo),
        "seed": args.seed,
        "precision": run["precision"],
        "instruction_model": run["base"],
    }
    write_result("chat-ppo-variants", fields | {"dpo": run["dpo"], "variants": variants})
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The chat demo, end to end: ``python -m demo.chat_pipeline`` (what ``make demo-chat`` runs).

The toy demo's experiment on a real instruction model, SmolLM2-135M-Instruct, inside its ChatML
template everywhere, with VADER of the reply standing in for the human labeller, on 2 CPU cores:

1. split        the distinct short first human turns of the shipped HH-RLHF harmless-base file, a
                fixed seeded split into held-out, labelling and PPO requests (:mod:`demo.chat_prompts`,
                ``<out>/data/{eval,label,ppo}.jsonl``, one-turn conversations);
2. preferences  K replies of the instruction model to each labelling request, VADER of each reply
                alone: best-vs-worst pairs (``prefs/pairs.jsonl``, DPO's) and the rankings of the K
                (``prefs/rankings.jsonl``, the reward model's);
3. reward_model ``rlhf-lit fit --config configs/demo_chat/reward_model.yaml`` (K-way loss, held-out
                pair accuracy), then DPO (``configs/demo_chat/dpo.yaml``, one run per beta);
4. ppo          ``rlhf-lit fit --config configs/demo_chat/ppo.yaml`` against that reward model
                (checkpoints along training for the frontier), then best-of-N of the instruction
                model with the same reward model (``rlhf-lit best-of-n`` on the held-out requests);
5. evaluate     the instruction model, PPO (its checkpoints and its export) and DPO on the held-out
                requests: judge score, KL to the instruction model, distinct-2, length, the share of
                replies that end their turn and of replies that write another turn's role markers;
6. report       the judge-against-KL frontier (``report/frontier.png``), the floors and samples
                (``report/summary.md``), per-stage times (``results.json``).

The stages run one at a time, each with ``--threads`` torch threads (2). A rerun
replaces the previous run's outputs under ``--out``, never a folder the demo did not create
(:func:`demo.plan.claim_out`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from demo.chat_plan import (
    CHAT_FULL,
    CHAT_TINY,
    DEVICES,
    HH_FILE,
    ChatBudget,
    best_of_n_command,
    default_model,
    demo_precision,
    dpo_command,
    on_device,
    ppo_command,
    preferences_command,
    reward_model_command,
    rollouts,
)
from demo.chat_prompts import write_prompt_splits
from demo.plan import NotADemoFolder, Paths, claim_out, parse_betas
from demo.runner import StageFailed, Timings, run_stages, say
from demo.summary import last_scalar
from rlhf_lit.artifacts import write_json_atomically
from rlhf_lit.child_runs import stop_on_signals
from rlhf_lit.evaluation.judges import DEFAULT_JUDGE
from rlhf_lit.integrity import DamagedFile
from rlhf_lit.sources import DamagedSource

DEFAULT_DPO_BETAS = (0.1,)
"""The DPO runs of the chat demo's frontier (``--dpo-betas``)."""


def build_parser() -> argparse.ArgumentParser:
    """The chat pipeline's options."""
    p = argparse.ArgumentParser(
        prog="python -m demo.chat_pipeline", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", default="logs/demo_chat", help="root of every output (default: %(default)s)")
    p.add_argument(
        "--model",
        default=None,
        help="SmolLM2-135M-Instruct as a Hugging Face folder (default: where `make smollm2` caches it)",
    )
    p.add_argument("--tiny", action="store_true", help="tiny budgets: a smoke test, not a result")
    p.add_argument("--judge", default=DEFAULT_JUDGE, help="judge spec 'module:function' (default: %(default)s)")
    p.add_argument(
        "--dpo-betas", type=parse_betas, default=DEFAULT_DPO_BETAS, metavar="B,B,...", help="one DPO run per beta"
    )
    p.add_argument("--seed", type=int, default=None, help="seed of every stage (default: the configs' seeds)")
    p.add_argument("--threads", type=int, default=None, help="torch threads of a stage that runs alone (default 2)")
    p.add_argument(
        "--precision",
        choices=("auto", "32-true", "bf16-mixed"),
        default="auto",
        help="precision of every stage: labels, reward model, DPO, PPO, best-of-N, evaluation (auto: bf16-mixed "
        "on a CPU with amx_bf16 or avx512_bf16 or a GPU with bf16, else 32-true)",
    )
    p.add_argument(
        "--device", choices=DEVICES, default="cpu", help="where every stage runs (default: %(default)s; cuda: one GPU)"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chat demo; returns the exit status (that of the first failing stage)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda: torch sees no GPU here (torch.cuda.is_available() is False)")
    try:
        # SIGTERM and SIGINT unwind the run (exit status 143, 130) and stop its running stage.
        with stop_on_signals("the chat demo", then="run it again to start over"):
            run(args)
    except NotADemoFolder as e:
        print(f"[demo] {e}", file=sys.stderr, flush=True)
        return 2
    except StageFailed as e:
        print(f"[demo] FAILED: {e}", file=sys.stderr, flush=True)
        return e.returncode or 1
    except (DamagedFile, DamagedSource) as e:
        print(f"[demo] error: {e} (delete or restore it, then run the demo again)", file=sys.stderr, flush=True)
        return 1
    return 0


def train(args: argparse.Namespace, model: str, budget: ChatBudget, paths: Paths, timings: Timings) -> dict:
    """Split, label, the reward model, DPO, PPO, then best-of-N, one at a time; returns facts for the report."""
    threads = args.threads or budget.threads
    t0 = time.perf_counter()
    sizes = {"eval": budget.eval_prompts, "label": budget.label_prompts, "ppo": None}
    splits = write_prompt_splits(HH_FILE, paths.dir("data"), sizes)
    timings["split"] = time.perf_counter() - t0
    counts = ", ".join(f"{part} {sizes[part] or 'the rest'}" for part in splits)
    say(f"split: {counts} requests -> {paths.dir('data')}")

    logs = paths.dir("logs")
    precision = demo_precision(args.precision, args.device)
    say(f"every stage on {args.device} at {precision} (--precision {args.precision})")
    # One stage at a time, each with every thread: measured on 2 cores, the reward model beside two DPO
    # runs (one thread each) took 5.9 s a step against 1.9 s alone, and each DPO run slowed as much, so
    # side by side cost more wall time than one after another; DPO beside PPO, one thread each, took 1.13 times
    # the two one after the other (bench/chat_side_by_side.py, docs/DEMO-CHAT.md "Speed levers").
    dpo = {f"dpo/beta_{b:g}": dpo_command(model, paths, budget, b, args.seed, precision) for b in args.dpo_betas}
    stages = {
        "preferences": preferences_command(model, paths, budget, args.judge, args.seed, precision),
        "reward_model": reward_model_command(model, paths, budget, args.seed, precision),
        **dpo,
        "ppo": ppo_command(model, paths, budget, args.judge, args.seed, precision),
        "best_of_n": best_of_n_command(model, paths, budget, args.judge, args.seed, precision),
    }
    stages = {name: on_device(cmd, args.device) for name, cmd in stages.items()}
    for name, cmd in stages.items():
        run_stages({name: cmd}, logs, timings, threads)
        if name == "reward_model":
            rm_accuracy = last_scalar(paths.run("reward_model"), "val/accuracy")
            say(f"reward_model: held-out pair accuracy {rm_accuracy}")
    return {
        "rm_accuracy": rm_accuracy,
        "dpo": list(dpo),
        "ppo_rollouts": rollouts(budget),
        "precision": precision,
        "device": args.device,
    }


def run(args: argparse.Namespace) -> dict:
    """The pipeline proper (see the module docstring); returns what it wrote to ``results.json``."""
    from demo.chat_report import evaluate_all, write_chat_summary

    t_start = time.perf_counter()
    budget = CHAT_TINY if args.tiny else CHAT_FULL
    model = args.model or default_model()
    paths = Paths(Path(args.out).absolute())
    claim_out(paths.root)
    paths.dir("logs").mkdir(parents=True)
    timings = Timings()
    trained = train(args, model, budget, paths, timings)
    results, frontier = evaluate_all(args, model, budget, paths, trained, timings)
    timings["total"] = time.perf_counter() - t_start
    summary, floors = write_chat_summary(paths, results, trained, frontier, timings)
    outcome = {
        "model": model,
        "metrics": {name: r["metrics"] for name, r in results.items()},
        "rm_val_accuracy": trained["rm_accuracy"],
        "precision": trained["precision"],
        "device": trained["device"],
        "floors": floors,
        "summary": str(summary),
        "frontier": str(paths.dir("report") / "frontier.json"),
        "timings_s": timings,
        "cpu_s": timings.cpu,
        "tiny": args.tiny,
    }
    write_json_atomically(paths.root / "results.json", outcome)
    print(summary.read_text(encoding="utf-8"))
    print(f"[demo] wall time: {timings['total']:.1f} s ({timings['total'] / 60:.1f} min)", flush=True)
    return json.loads(json.dumps(outcome))


if __name__ == "__main__":
    sys.exit(main())

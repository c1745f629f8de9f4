"""The chat demo's measurements and report: every policy on the held-out requests
(:func:`evaluate_all`), the floors the demo must clear (:func:`check_floors`) and
``report/summary.md`` (:func:`write_chat_summary`).

Every policy is sampled once per held-out request at PPO's sampling settings, inside the chat
template, and measured by :func:`rlhf_lit.evaluation.policy_metrics.evaluate_policy` against the
instruction model: VADER of the reply (never the request or the template's markers), KL to the
instruction model (a Monte Carlo estimate per reply), distinct-2, length, the share of replies that
end their turn (``<|im_end|>`` before ``max_new_tokens``) and of replies holding another turn's role
markers (:mod:`rlhf_lit.evaluation.turns`). Best-of-N comes from ``rlhf-lit best-of-n`` (analytic KL).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict
from pathlib import Path

from demo.chat_plan import CHAT_FULL, ChatBudget, demo_sampling
from demo.frontier import export_checkpoint_policy, point_from_evaluation, points_from_best_of_n, write_frontier
from demo.plan import Paths
from demo.report import _cell
from demo.runner import Timings, say
from demo.seeds_report import interpolate
from rlhf_lit.artifacts import write_json_atomically, write_text_atomically
from rlhf_lit.integrity import check_json_file

BASE = "instruction model"
"""The name of the instruction model's row: PPO's and DPO's start and reference."""
FLOORS = {"judge_gain": 0.20, "max_kl": 8.0, "ended_drop": 0.05, "rm_accuracy": 0.70}
"""What the demo must show on its held-out requests: PPO's judge mean at least ``judge_gain`` above the
instruction model's at a KL of at most ``max_kl`` nats per reply; PPO at or above DPO at equal KL; no
reply with another turn's role markers and PPO's share of replies that end their turn at most
``ended_drop`` below the instruction model's; the reward model's held-out pair accuracy at least
``rm_accuracy``."""


def evaluate_as_the_demo(
    policy: str, prompts, model: str, judge, precision: str, device: str = "cpu", budget: ChatBudget | None = None
) -> dict:
    """The chat demo's evaluation of one policy (the pipeline's and every chat bench's): one reply to each of
    ``prompts`` (the held-out requests) at PPO's sampling settings (:func:`demo.chat_plan.demo_sampling` of
    ``budget``, the full one by default), sampling seed 0, at ``precision`` on ``device``, KL to the instruction
    model ``model``, judged by ``judge``: :func:`~rlhf_lit.evaluation.policy_metrics.evaluate_policy`'s result, with
    ``config`` saying what was evaluated and how (``policy``, ``reference``, ``sampling``, ``precision``)."""
    from rlhf_lit.evaluation.policy_metrics import evaluate_policy

    sampling = demo_sampling(budget or CHAT_FULL)
    result = evaluate_policy(
        policy, prompts, reference=model, judge=judge, sampling=sampling, seed=0, precision=precision, device=device
    )
    result["config"] = {"policy": policy, "reference": model, "sampling": asdict(sampling), "precision": precision}
    return result


def read_evaluations(folder: Path | str) -> dict[str, dict]:
    """Every evaluation a chat demo run wrote in ``folder/eval`` (:func:`evaluate_all`: ``instruction``,
    ``ppo_rollout<N>``, ``ppo``, ``dpo_beta_<beta>``), by name in name order: each file's ``metrics``,
    ``samples`` and ``config``. The benches that read a finished run read its evaluations here."""
    return {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted((Path(folder) / "eval").glob("*.json"))}


def evaluate_all(
    args: argparse.Namespace, model: str, budget: ChatBudget, paths: Paths, trained: dict, timings: Timings
) -> tuple[dict[str, dict], tuple[str, list[str]]]:
    """Evaluate the instruction model, PPO's checkpoints and export, and the DPO policies on the
    held-out requests (in this process, ``--threads`` torch threads); write the frontier.

    Returns ``(evaluations by name, (frontier.png path, its markdown table))``.
    """
    import torch
    from transformers.utils import logging as hf_logging

    from rlhf_lit.data.prompt_source import read_prompt_source
    from rlhf_lit.evaluation.judges import load_judge
    from rlhf_lit.models.checkpoint_policy import rollout_checkpoints

    torch.set_num_threads(args.threads or budget.threads)
    hf_logging.disable_progress_bar()
    t0, c0 = time.perf_counter(), time.process_time()
    prompts = read_prompt_source(str(paths.dir("data") / "eval.jsonl")).prompts
    judge = load_judge(args.judge)
    precision = trained["precision"]  # as the labels and best-of-N sampled

    def measured(name: str, policy: str) -> dict:
        result = evaluate_as_the_demo(policy, prompts, model, judge, precision, trained["device"], budget)
        result["config"]["judge"] = args.judge
        write_json_atomically(paths.dir("eval") / f"{name.replace('/', '_')}.json", result)
        say(f"evaluate: {name}: judge {result['metrics']['judge_mean']:.3f}, KL {result['metrics']['kl_mean']:.2f}")
        return result

    results = {BASE: measured("instruction", model)}
    checkpoints = []
    for rollout, ckpt in sorted(rollout_checkpoints(str(paths.checkpoints)).items()):
        if rollout == trained["ppo_rollouts"]:  # the export holds the same weights
            continue
        policy = export_checkpoint_policy(ckpt, model, str(paths.checkpoints / f"rollout={rollout}"))
        checkpoints.append((rollout, measured(f"ppo_rollout{rollout}", policy)))
    results["PPO"] = measured("ppo", str(paths.model("ppo")))
    for stage in trained["dpo"]:
        results[f"DPO ({stage.split('_', 1)[1].replace('_', ' ')})"] = measured(stage, str(paths.model(stage)))
    timings["evaluate"], timings.cpu["evaluate"] = time.perf_counter() - t0, time.process_time() - c0

    points = [point_from_evaluation(results[BASE], BASE, "-")]
    points += [point_from_evaluation(r, "PPO", f"rollout {n}") for n, r in checkpoints]
    points.append(point_from_evaluation(results["PPO"], "PPO", f"rollout {trained['ppo_rollouts']}"))
    points += [point_from_evaluation(r, "DPO", name[5:-1]) for name, r in results.items() if name.startswith("DPO")]
    points += points_from_best_of_n(check_json_file(paths.dir("best_of_n") / "best_of_n.json", want_object=False))
    trained["ppo_curve"] = [(0.0, results[BASE]["metrics"]["judge_mean"])] + [
        (r["metrics"]["kl_mean"], r["metrics"]["judge_mean"]) for _, r in [*checkpoints, (None, results["PPO"])]
    ]
    return results, write_frontier(points, str(paths.dir("report")), reference=BASE)


def standard_error(metrics: dict, name: str = "judge") -> float:
    """The standard error of a mean over the evaluation's replies, from its population std."""
    n = metrics["num_samples"]
    return metrics[f"{name}_std"] / math.sqrt(n - 1) if n > 1 else float("nan")


def check_floors(results: dict[str, dict], rm_accuracy: float | None, ppo_curve: list[tuple[float, float]]) -> dict:
    """Each floor of :data:`FLOORS` with its measured value and whether it holds.

    PPO against DPO at equal KL: DPO's judge score set against PPO's curve (the instruction model at
    KL 0, PPO's checkpoints, its export), interpolated at each DPO policy's KL (never extrapolated; a DPO
    policy beyond PPO's KL compares with DPO's own curve at PPO's KL instead).
    """
    base, ppo = results[BASE]["metrics"], results["PPO"]["metrics"]
    gain = ppo["judge_mean"] - base["judge_mean"]
    dpo_points = [(r["metrics"]["kl_mean"], r["metrics"]["judge_mean"]) for n, r in results.items() if "DPO" in n]
    margins = []
    for kl, judge in dpo_points:
        at = interpolate(ppo_curve, kl)
        if at is None:  # DPO beyond PPO's reach: DPO's own curve at PPO's KL
            dpo_at = interpolate([(0.0, base["judge_mean"]), *dpo_points], ppo["kl_mean"])
            at, judge = (ppo["judge_mean"], dpo_at) if dpo_at is not None else (None, judge)
        if at is not None:
            margins.append(at - judge)
    other_turns = max(r["metrics"]["other_turn_fraction"] for r in results.values())
    floors = {
        "judge_gain": {"value": gain, "floor": FLOORS["judge_gain"], "holds": gain >= FLOORS["judge_gain"]},
        "kl": {"value": ppo["kl_mean"], "ceiling": FLOORS["max_kl"], "holds": ppo["kl_mean"] <= FLOORS["max_kl"]},
        "ppo_minus_dpo_at_equal_kl": {
            "value": min(margins) if margins else None,
            "holds": bool(margins) and min(margins) >= 0,
        },
        "other_turn_fraction": {"value": other_turns, "holds": other_turns == 0},
        "ended_drop": {
            "value": base["ended_fraction"] - ppo["ended_fraction"],
            "ceiling": FLOORS["ended_drop"],
            "holds": base["ended_fraction"] - ppo["ended_fraction"] <= FLOORS["ended_drop"],
        },
        "rm_accuracy": {
            "value": rm_accuracy,
            "floor": FLOORS["rm_accuracy"],
            "holds": rm_accuracy is not None and rm_accuracy >= FLOORS["rm_accuracy"],
        },
    }
    return floors


def results_rows(results: dict[str, dict]) -> list[str]:
    """Markdown rows: one per evaluated policy (judge mean +- its standard error)."""
    lines = [
        "| policy | judge (VADER) | KL to the instruction model (nats / reply) | distinct-2 | length | ends its turn | other turn |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, result in results.items():
        m = result["metrics"]
        lines.append(
            f"| {name} | {m['judge_mean']:.3f} +- {standard_error(m):.3f} | {m['kl_mean']:.2f} | {m['distinct_2']:.3f} "
            f"| {m['length_mean']:.1f} | {m['ended_fraction']:.3f} | {m['other_turn_fraction']:.3f} |"
        )
    return lines


def samples_rows(results: dict[str, dict], count: int) -> list[str]:
    """Markdown: the first ``count`` held-out requests and each policy's reply (judge score)."""
    names = list(results)
    lines = ["| request | " + " | ".join(names) + " |", "|---" * (1 + len(names)) + "|"]
    for i in range(min(count, *(len(r["samples"]) for r in results.values()))):
        request = results[BASE]["samples"][i]["prompt"][-1]["content"]
        cells = [
            f"{_cell(results[n]['samples'][i]['response'])} ({results[n]['samples'][i]['judge']:.2f})" for n in names
        ]
        lines.append(f"| {_cell(request)} | " + " | ".join(cells) + " |")
    return lines


def write_chat_summary(
    paths: Paths, results: dict[str, dict], trained: dict, frontier: tuple[str, list[str]], timings: Timings
) -> tuple[Path, dict]:
    """``report/summary.md``: the table, the floors, the frontier, samples and the stages' times."""
    floors = check_floors(results, trained["rm_accuracy"], trained["ppo_curve"])
    floor_lines = [
        f"- {name}: {_value(f['value'])} ({'holds' if f['holds'] else 'DOES NOT HOLD'}"
        + (f"; floor {f['floor']}" if "floor" in f else "")
        + (f"; at most {f['ceiling']}" if "ceiling" in f else "")
        + ")"
        for name, f in floors.items()
    ]
    md = [
        "# Chat demo summary",
        "",
        f"SmolLM2-135M-Instruct on {results[BASE]['metrics']['num_samples']} held-out HH-RLHF requests, one reply "
        "each, in its chat template, at PPO's sampling settings; judge = VADER compound of the reply; KL = sum "
        "over reply tokens of log pi - log pi_instruction.",
        "",
        *results_rows(results),
        "",
        f"Reward model held-out pair accuracy: {_value(trained['rm_accuracy'])}",
        "",
        "## Floors",
        "",
        *floor_lines,
        "",
        "## Frontier: judge score against KL to the instruction model",
        "",
        f"![frontier]({Path(frontier[0]).name})",
        "",
        *frontier[1],
        "",
        "## Samples",
        "",
        *samples_rows(results, 6),
        "",
        "## Time per stage",
        "",
        "Wall (s): " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()),
        "",
        "CPU (s): " + ", ".join(f"{k} {v:.0f}" for k, v in timings.cpu.items()),
        "",
    ]
    path = paths.dir("report") / "summary.md"
    write_text_atomically(path, "\n".join(md))
    return path, floors


def _value(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.3f}"

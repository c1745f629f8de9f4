"""Where the chat demo's time goes: every stage's wall time and PPO's seconds per rollout phase, per run of
``python -m demo.chat_pipeline`` and as means +- standard errors over runs, beside verl's published
single-GPU PPO step.

    .venv/bin/python bench/chat_phase_times.py --demo logs/chat_gpu/seed_0 --demo logs/chat_gpu/seed_1 \\
        --demo logs/chat_gpu/seed_2 --ran-on "one NVIDIA H200"

Each ``--demo`` is a folder the pipeline finished (its ``results.json``: the device, the precision and the
stages' wall times; PPO's TensorBoard events in ``ppo/version_0``). PPO's phases are the module's own
timers, logged every rollout (``time/generate_s``: sampling the replies; ``time/score_s``: the no-grad
passes (old log-probabilities, reference, values, the reward model) and the advantages; ``time/train_s``:
every minibatch update of policy and critic; ``time/text_s``: decoding for the text metrics), averaged over
rollouts 2 to the last (the first pays for warm-up). verl's step is its quickstart's published log
(``docs/start/quickstart.rst`` of volcengine/verl: PPO of Qwen2.5-0.5B-Instruct on GSM8K, one GPU, 256
prompts a step, up to 256 new tokens, vLLM sampling; :data:`VERL_QUICKSTART_STEP`), set against PPO's
phases as generate = ``gen``, score = ``ref`` + ``values`` + ``adv``, train = ``update_critic`` +
``update_actor``. Its model is 3.7 times larger and its step samples about 40 times more tokens: the
comparison is of shares and of tokens per second, not of seconds.

Writes ``bench/results/chat-phase-times-<UTC date>[-N].json`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from results_file import write_result

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the demo's package, beside rlhf_lit in a clone

PHASES = ("generate", "score", "train", "text")
"""PPO's timed phases (``time/<phase>_s``, rlhf_lit/stages/ppo/metrics.py)."""
STAGES = ("preferences", "reward_model", "dpo/beta_0.1", "ppo", "best_of_n", "evaluate", "total")
"""The pipeline's stages whose wall time the table shows (``results.json``'s ``timings_s``)."""
VERL_QUICKSTART_STEP = {
    "source": "volcengine/verl docs/start/quickstart.rst, the log of step 0",
    "model": "Qwen2.5-0.5B-Instruct (policy and critic)",
    "prompts": 256,
    "response_length_mean": 239.133,
    "seconds": {
        "gen": 21.470,
        "ref": 4.360,
        "values": 5.800,
        "adv": 0.109,
        "update_critic": 15.664,
        "update_actor": 20.314,
    },
}
"""verl's published single-GPU PPO step (its quickstart's log): seconds per phase and the step's size."""
VERL_AS_PHASES = {"generate": ("gen",), "score": ("ref", "values", "adv"), "train": ("update_critic", "update_actor")}
"""verl's timers summed into PPO's phases."""


def run_times(demo: Path) -> dict:
    """One finished run's device, precision, stage wall times and PPO's mean seconds per phase (rollouts 2..)."""
    from demo.report import read_scalars

    results = json.loads((demo / "results.json").read_text(encoding="utf-8"))
    scalars = read_scalars(str(demo / "ppo" / "version_0"))
    phases = {}
    for phase in (*PHASES, "tokens_per"):
        tag = f"time/{phase}_s"
        values = scalars.get(tag, ([], []))[1]
        if len(values) < 2:
            raise SystemExit(f"{demo}: PPO logged {tag} for {len(values)} rollouts; at least 2 are needed")
        phases[phase] = statistics.fmean(values[1:])
    rollout_s = sum(phases[p] for p in PHASES)
    return {
        "demo": str(demo),
        "device": results.get("device", "cpu"),
        "precision": results.get("precision"),
        "stages_s": {s: results["timings_s"].get(s) for s in STAGES},
        "ppo_phase_s": {p: phases[p] for p in PHASES},
        "ppo_rollout_s": rollout_s,
        "ppo_tokens_per_s": phases["tokens_per"],
        "rollouts": len(scalars["time/generate_s"][1]),
    }


def verl_step() -> dict:
    """verl's published step in PPO's phases: seconds, shares and response tokens per second."""
    seconds = VERL_QUICKSTART_STEP["seconds"]
    phases = {p: sum(seconds[k] for k in keys) for p, keys in VERL_AS_PHASES.items()}
    total = sum(phases.values())
    tokens = VERL_QUICKSTART_STEP["prompts"] * VERL_QUICKSTART_STEP["response_length_mean"]
    return {
        "phase_s": phases,
        "step_s": total,
        "shares": {p: v / total for p, v in phases.items()},
        "tokens_per_s": tokens / total,
    }


def mean_se(values: list[float]) -> tuple[float, float | None]:
    """Mean and standard error (None for one value)."""
    m = statistics.fmean(values)
    return m, (statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else None)


def cell(values: list[float], digits: int = 1) -> str:
    """``mean +- s.e.`` over runs (the mean alone for one run)."""
    m, se = mean_se(values)
    return f"{m:.{digits}f}" if se is None else f"{m:.{digits}f} ± {se:.{digits}f}"


def markdown(runs: list[dict], verl: dict) -> str:
    """Two tables: the stages' wall times, then PPO's phases (seconds per rollout and shares) beside verl's."""
    lines = ["| stage | wall time (s) |", "|---|---|"]
    for stage in STAGES:
        values = [r["stages_s"][stage] for r in runs if r["stages_s"].get(stage) is not None]
        if values:
            lines.append(f"| {stage} | {cell(values)} |")
    lines += [
        "",
        "| PPO phase | rlhf-lit (s / rollout) | share | verl quickstart (s / step) | share |",
        "|---|---|---|---|---|",
    ]
    for phase in PHASES:
        ours = [r["ppo_phase_s"][phase] for r in runs]
        shares = [r["ppo_phase_s"][phase] / r["ppo_rollout_s"] for r in runs]
        theirs = verl["phase_s"].get(phase)
        verl_cells = "- | -" if theirs is None else f"{theirs:.1f} | {verl['shares'][phase]:.2f}"
        lines.append(f"| {phase} | {cell(ours, 2)} | {cell(shares, 2)} | {verl_cells} |")
    lines.append(f"| whole rollout | {cell([r['ppo_rollout_s'] for r in runs], 2)} | 1 | {verl['step_s']:.1f} | 1 |")
    lines.append(
        f"| response tokens / s | {cell([r['ppo_tokens_per_s'] for r in runs], 0)} | | {verl['tokens_per_s']:.0f} | |"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Read the runs, print the tables, write the result file."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--demo", action="append", required=True, type=Path, help="a finished chat-pipeline folder")
    p.add_argument("--ran-on", default="this machine", help="the machine the runs ran on (recorded)")
    p.add_argument("--no-write", action="store_true", help="print the tables only")
    args = p.parse_args(argv)
    runs = [run_times(d) for d in args.demo]
    verl = verl_step()
    table = markdown(runs, verl)
    print(table)
    if not args.no_write:
        write_result(
            "chat-phase-times",
            {"ran_on": args.ran_on, "runs": runs, "verl": verl, "verl_source": VERL_QUICKSTART_STEP, "table": table},
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

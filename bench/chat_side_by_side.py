"""Two chat-demo stages on 2 cores: one after the other with both threads each, or side by side with one
thread each. Which takes less wall time?

    OMP_NUM_THREADS=2 .venv/bin/python bench/chat_side_by_side.py --demo logs/demo_chat --out runs/side \\
        --dpo-steps 40 --ppo-rollouts 4

1. **the run**: ``--demo`` is a folder ``make demo-chat`` wrote; its best-vs-worst pairs (``prefs/pairs.jsonl``),
   PPO requests (``data/ppo.jsonl``) and reward model (``reward_model/model``) are read, never written;
2. **the stages**: DPO and PPO as the demo runs them (:func:`demo.chat_plan.dpo_command`,
   :func:`demo.chat_plan.ppo_command`, the run's precision), shortened to ``--dpo-steps`` optimizer steps and
   ``--ppo-rollouts`` rollouts, each arm in a folder of its own under ``--out``;
3. **the arms**, in one run on one machine: ``serial`` runs the stages one after the other with
   ``--threads-alone`` torch threads each (the demo's schedule), ``side_by_side`` starts them together with
   ``--threads-beside`` each (:func:`demo.runner.run_stages`). Each stage's wall time, each arm's, and the
   side-by-side arm's wall time over the serial one's.

Writes ``bench/results/chat-side-by-side-<UTC date>[-N].json`` (a new name, never over an earlier run).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

from chat_ppo_variants import demo_files
from results_file import write_result

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the demo's package, beside rlhf_lit in a clone

from demo.runner import Timings, run_stages  # noqa: E402


def demo_stages(demo: Path, folder: Path, model: str, dpo_steps: int, ppo_rollouts: int) -> dict[str, list[str]]:
    """DPO (beta 0.1) and PPO of the demo on ``demo``'s data, writing under ``folder``, shortened."""
    from demo.chat_plan import CHAT_FULL, dpo_command, ppo_command
    from demo.plan import Paths

    wanted = demo_files(
        demo,
        pairs="prefs/pairs.jsonl",
        ppo_prompts="data/ppo.jsonl",
        reward_model="reward_model/model",
        results="results.json",
    )
    precision = json.loads(wanted["results"].read_text(encoding="utf-8"))["precision"]
    paths = Paths(folder.absolute())
    for name, source in (("prefs", wanted["pairs"]), ("data", wanted["ppo_prompts"])):
        paths.dir(name).mkdir(parents=True)
        shutil.copyfile(source, paths.dir(name) / source.name)  # where the demo's commands read them
    # No checkpoint inside the shortened run: both arms write the same exports and nothing else.
    budget = replace(CHAT_FULL, checkpoint_every=ppo_rollouts + 1)
    dpo = dpo_command(model, paths, budget, 0.1, None, precision) + ["--trainer.max_steps", str(dpo_steps)]
    ppo = ppo_command(model, paths, budget, "rlhf_lit.evaluation.judges:vader", None, precision)
    ppo += ["--model.init_args.reward_model", str(wanted["reward_model"].absolute())]
    ppo += ["--model.init_args.max_rollouts", str(ppo_rollouts)]
    return {"dpo": dpo, "ppo": ppo}


def run_arms(
    stages_for, out: Path, threads_alone: int, threads_beside: int, arms: tuple[str, ...] = ("serial", "side_by_side")
) -> dict:
    """Each arm's wall seconds (the arm's own and each stage's); ``stages_for(folder)`` builds the stages'
    commands for an arm writing under ``folder``."""
    measured = {}
    for arm in arms:
        folder = out / arm
        stages = stages_for(folder)
        logs = folder / "logs"
        logs.mkdir(parents=True)
        timings = Timings()
        t0 = time.perf_counter()
        if arm == "serial":
            for name, cmd in stages.items():
                run_stages({name: cmd}, logs, timings, threads_alone)
        else:
            run_stages(stages, logs, timings, threads_beside)
        wall = time.perf_counter() - t0
        threads = threads_alone if arm == "serial" else threads_beside
        measured[arm] = {"wall_s": wall, "threads": threads, "stages_s": dict(timings), "cpu_s": dict(timings.cpu)}
        print(f"{arm}: {wall:.1f} s ({threads} threads a stage): {json.dumps(measured[arm]['stages_s'])}", flush=True)
    if len(measured) == 2:
        measured["side_by_side_over_serial"] = measured["side_by_side"]["wall_s"] / measured["serial"]["wall_s"]
        print(f"side by side / serial: {measured['side_by_side_over_serial']:.3f}", flush=True)
    return measured


def main(argv: list[str] | None = None) -> int:
    """Run both arms on a finished demo folder, print them, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--demo", required=True, help="a finished `make demo-chat` folder (read only)")
    p.add_argument("--model", default=None, help="SmolLM2-135M-Instruct folder (default: make smollm2's cache)")
    p.add_argument("--out", required=True, help="where the arms' fits go (a new folder)")
    p.add_argument("--dpo-steps", type=int, default=40, help="DPO's optimizer steps in each arm")
    p.add_argument("--ppo-rollouts", type=int, default=4, help="PPO's rollouts in each arm")
    p.add_argument("--threads-alone", type=int, default=2, help="torch threads of a stage run alone")
    p.add_argument("--threads-beside", type=int, default=1, help="torch threads of each stage run side by side")
    p.add_argument("--no-write", action="store_true", help="print only; no result file")
    args = p.parse_args(argv)
    from demo.chat_plan import fetched_model

    model = args.model or fetched_model()
    demo, out = Path(args.demo), Path(args.out)
    out.mkdir(parents=True, exist_ok=False)  # a new folder: never over an earlier run's
    build = lambda folder: demo_stages(demo, folder, model, args.dpo_steps, args.ppo_rollouts)  # noqa: E731
    measured = run_arms(build, out, args.threads_alone, args.threads_beside)
    if not args.no_write:
        fields = {"demo": str(demo), "dpo_steps": args.dpo_steps, "ppo_rollouts": args.ppo_rollouts}
        write_result("chat-side-by-side", {**fields, **measured})
    return 0


if __name__ == "__main__":
    sys.exit(main())

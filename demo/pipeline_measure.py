"""The offline demo's measurements (:mod:`demo.pipeline`'s last stages, in its process): SFT, the PPO
and DPO policies on the held-out prompts, the PPO checkpoints and best-of-N on the frontier, the report."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from demo.plan import Budget, Paths
from demo.runner import Timings, say
from rlhf_lit.integrity import check_json_file


def measure(
    args: argparse.Namespace, budget: Budget, paths: Paths, trained: dict, timings: Timings
) -> tuple[dict[str, dict], str, tuple[str, list[str]] | None]:
    """Evaluate SFT, the PPO and DPO policies on the held-out prompts, the frontier, and write the report.

    In this process. Returns ``(evaluations by name, report.md path, (frontier.png, table rows) or None)``.
    """
    import torch
    from transformers.utils import logging as hf_logging

    from demo.held_out_eval import evaluate
    from demo.report import write_report
    from demo.story_prompts import RANGES
    from rlhf_lit.models.generation import SamplingConfig

    torch.set_num_threads(1)
    hf_logging.disable_progress_bar()  # one "Loading weights" bar per model would bury the table
    t0, c0 = time.perf_counter(), time.process_time()
    # The temperature PPO sampled with, so the measured KL is the one its penalty controlled.
    sampling = SamplingConfig(temperature=trained["temperature"], max_new_tokens=trained["max_new_tokens"])
    start, count = RANGES["eval"]

    def measured(name: str, model: Path) -> dict:
        return evaluate(
            str(model),
            str(paths.model("sft")),
            args.paragraphs,
            start=start,
            count=budget.eval_prompts or count,
            judge=args.judge,
            sampling=sampling,
            out=str(paths.dir("eval") / f"{name.replace('/', '_')}.json"),
        )

    results = {name: measured(name, paths.model(name)) for name in ("sft", *trained["policies"], *trained["dpo"])}
    timings["evaluate"], timings.cpu["evaluate"] = time.perf_counter() - t0, time.process_time() - c0
    say(f"evaluate: done in {timings['evaluate']:.1f} s -> {paths.dir('eval')}")

    frontier = None
    if not args.skip_frontier:
        t0, c0 = time.perf_counter(), time.process_time()
        frontier = measure_frontier(paths, results, trained, measured)
        timings["frontier"], timings.cpu["frontier"] = time.perf_counter() - t0, time.process_time() - c0
        say(f"frontier: done in {timings['frontier']:.1f} s -> {frontier[0]}")

    t0 = time.perf_counter()
    with_kl0 = "ppo_kl0" in trained["policies"]
    report = write_report(
        str(paths.run("ppo")),
        str(paths.dir("report")),
        label="PPO",
        compare=str(paths.run("ppo_kl0")) if with_kl0 else None,
        compare_label="PPO, KL coef 0",
        before=str(paths.dir("eval") / "sft.json"),
        after=str(paths.dir("eval") / "ppo.json"),
    )
    timings["report"] = time.perf_counter() - t0
    return results, report, frontier


def measure_frontier(paths: Paths, results: dict[str, dict], trained: dict, measured) -> tuple[str, list[str]]:
    """Evaluate the PPO checkpoints, gather every method's points and write the frontier plot and table.

    Args:
        results: the evaluations already made (``sft``, ``ppo``, ``ppo_kl0``, ``dpo/beta_<b>``).
        trained: what :func:`train` returned.
        measured: ``(name, model dir) -> evaluation`` on the held-out prompts.

    Returns:
        ``(frontier.png path, markdown table rows)``.
    """
    from demo.frontier import export_checkpoint_policy, point_from_evaluation, points_from_best_of_n, write_frontier
    from rlhf_lit.models.checkpoint_policy import rollout_checkpoints

    sft = str(paths.model("sft"))
    final = trained["ppo_rollouts"]
    points = [point_from_evaluation(results["sft"], "SFT", "-")]
    ppo = []
    for rollout, ckpt in rollout_checkpoints(str(paths.checkpoints)).items():
        if rollout == final:  # the same weights as the export (tests/demo/test_frontier.py checks it)
            continue
        model = export_checkpoint_policy(ckpt, sft, str(paths.checkpoints / f"rollout={rollout}"))
        ppo.append(point_from_evaluation(measured(f"ppo_rollout{rollout}", Path(model)), "PPO", f"rollout {rollout}"))
    ppo.append(point_from_evaluation(results["ppo"], "PPO", f"rollout {final}"))
    points += ppo
    if "ppo_kl0" in results:
        points.append(point_from_evaluation(results["ppo_kl0"], "PPO, KL coef 0", f"rollout {final}"))
    points += [point_from_evaluation(results[name], "DPO", f"beta {name.rsplit('_', 1)[1]}") for name in trained["dpo"]]
    points += points_from_best_of_n(check_json_file(paths.dir("best_of_n") / "best_of_n.json", want_object=False))
    return write_frontier(points, str(paths.dir("report")))

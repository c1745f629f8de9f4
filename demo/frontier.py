"""The demo's judge-score-against-KL frontier: SFT, PPO along training, DPO, best-of-N on one plot.

Every method is measured on the held-out prompts against the same SFT reference:

- SFT, PPO (checkpoints along training and the final export), PPO with KL coefficient 0 and DPO
  (one policy per beta) are sampled once per prompt by :func:`demo.held_out_eval.evaluate`;
  their KL is the Monte Carlo estimate of ``KL(policy || SFT)`` per response, their judge score
  the mean over completions, with its standard error ``std / sqrt(n)``;
- best-of-N (``rlhf-lit best-of-n``) picks the RM's favourite of N SFT samples for N = 1, 2, 4, ...;
  its KL is the analytic ``log N - (N - 1) / N`` and its standard error is over prompts.

The points, the table and the plot are the library's (:mod:`rlhf_lit.evaluation.frontier`, also
``rlhf-lit frontier``); this module adds the demo's export of checkpoint policies and its
``frontier.json`` (the judge score under ``judge`` / ``judge_se``).

PPO checkpoints (``RolloutCheckpoint``) hold the whole ``PPOModule`` state; the library reads the
policy out of one (:mod:`rlhf_lit.models.checkpoint_policy`, also ``rlhf-lit export-policy``) and
:func:`export_checkpoint_policy` writes it as a Hugging Face model the evaluation can load.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence

from rlhf_lit.evaluation.frontier import (  # noqa: F401 (the demo's points, table and plot are the library's)
    FrontierPoint,
    draw_frontier,
    frontier_table,
    point_from_evaluation,
    points_from_best_of_n,
)
from rlhf_lit.models.checkpoint_policy import load_checkpoint_policy

_EXPORT_LOCK = threading.Lock()
"""One checkpoint export at a time: ``from_pretrained`` builds models under a process-wide device context
(meta tensors), so two threads loading at once can leave one with meta weights ("Cannot copy out of meta
tensor"); the studies export from a pool of threads (:func:`demo.runner.run_pool`)."""


def export_checkpoint_policy(checkpoint: str, base_model: str, out_dir: str) -> str:
    """Write the policy of ``checkpoint`` and ``base_model``'s tokenizer to ``out_dir``; returns ``out_dir``.

    Safe from several threads: one export at a time (:data:`_EXPORT_LOCK`).
    """
    from transformers import AutoTokenizer

    with _EXPORT_LOCK:
        load_checkpoint_policy(checkpoint, base_model).save_pretrained(out_dir)
        AutoTokenizer.from_pretrained(base_model).save_pretrained(out_dir)
    return out_dir


def write_frontier(points: Sequence[FrontierPoint], out_dir: str, reference: str = "SFT") -> tuple[str, list[str]]:
    """``frontier.png`` and ``frontier.json`` in ``out_dir``, the KL to ``reference`` (its name on the axis);
    returns the PNG path and the markdown table."""
    os.makedirs(out_dir, exist_ok=True)
    png = draw_frontier(
        points,
        os.path.join(out_dir, "frontier.png"),
        title=f"Judge score against KL to {reference}",
        xlabel=f"KL to {reference} (nats per response)",
    )
    rows = [
        {
            "method": p.method,
            "setting": p.setting,
            "kl": p.kl,
            "judge": p.score,
            "judge_se": p.score_se,
            "n": p.n,
            "kl_analytic": p.kl_analytic,
            "note": p.note,
        }
        for p in points
    ]
    with open(os.path.join(out_dir, "frontier.json"), "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=1)
    return png, frontier_table(points, reference=reference)

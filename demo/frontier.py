"""The demo's judge-score-against-KL frontier: SFT, PPO along training, DPO, best-of-N on one plot.

Every method is measured on the held-out prompts against the same SFT reference:

- SFT, PPO (checkpoints along training and the final export), PPO with KL coefficient 0 and DPO
  (one policy per beta) are sampled once per prompt by :func:`demo.held_out_eval.evaluate`;
  their KL is the Monte Carlo estimate of ``KL(policy || SFT)`` per response, their judge score
  the mean over completions, with its standard error ``std / sqrt(n)``;
- best-of-N (``rlhf-lit best-of-n``) picks the RM's favourite of N SFT samples for N = 1, 2, 4, ...;
  its KL is the analytic ``log N - (N - 1) / N`` and its standard error is over prompts.

PPO checkpoints (``RolloutCheckpoint``) hold the whole ``PPOModule`` state; the library reads the
policy out of one (:mod:`rlhf_lit.models.checkpoint_policy`, also ``rlhf-lit export-policy``) and
:func:`export_checkpoint_policy` writes it as a Hugging Face model the evaluation can load.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rlhf_lit.models.checkpoint_policy import load_checkpoint_policy

_EXPORT_LOCK = threading.Lock()
"""One checkpoint export at a time: ``from_pretrained`` builds models under a process-wide device context
(meta tensors), so two threads loading at once can leave one with meta weights ("Cannot copy out of meta
tensor"); the studies export from a pool of threads (:func:`demo.runner.run_pool`)."""


@dataclass(frozen=True)
class FrontierPoint:
    """One policy (or best-of-N setting) on the frontier: its KL to SFT and judge score.

    Attributes:
        method: the line it belongs to on the plot (``SFT``, ``PPO``, ``DPO``, ``best-of-N`` ...).
        setting: what distinguishes it within the method (``rollout 10``, ``beta 0.1``, ``N 4``).
        kl: KL to the SFT model in nats per response (measured, or analytic for best-of-N).
        judge: mean judge score.
        judge_se: standard error of ``judge``.
        n: completions the mean is over (best-of-N: prompts, one pick each).
        kl_analytic: the KL is the analytic best-of-N formula, not a measurement.
        note: extra text for the table (e.g. how many samples best-of-N drew per prompt).
    """

    method: str
    setting: str
    kl: float
    judge: float
    judge_se: float
    n: int
    kl_analytic: bool = False
    note: str = ""


def export_checkpoint_policy(checkpoint: str, base_model: str, out_dir: str) -> str:
    """Write the policy of ``checkpoint`` and ``base_model``'s tokenizer to ``out_dir``; returns ``out_dir``.

    Safe from several threads: one export at a time (:data:`_EXPORT_LOCK`).
    """
    from transformers import AutoTokenizer

    with _EXPORT_LOCK:
        load_checkpoint_policy(checkpoint, base_model).save_pretrained(out_dir)
        AutoTokenizer.from_pretrained(base_model).save_pretrained(out_dir)
    return out_dir


def _stderr(values: Sequence[float]) -> float:
    """Standard error of the mean: sample standard deviation / sqrt(n) (0 for fewer than 2 values)."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def point_from_evaluation(result: Mapping, method: str, setting: str) -> FrontierPoint:
    """A frontier point from a :func:`demo.held_out_eval.evaluate` result (one sample per completion)."""
    judges = [s["judge"] for s in result["samples"]]
    kls = [s["kl"] for s in result["samples"]]
    if not judges:
        raise ValueError(f"{method} {setting}: the evaluation has no samples")
    return FrontierPoint(method, setting, kl=sum(kls) / len(kls), judge=sum(judges) / len(judges),
                         judge_se=_stderr(judges), n=len(judges))  # fmt: skip


def points_from_best_of_n(result: Mapping, method: str = "best-of-N") -> list[FrontierPoint]:
    """One frontier point per N of an ``rlhf-lit best-of-n`` result (it needs the judge's scores)."""
    config = result["config"]
    note = f"{config['num_samples']} samples per prompt, exact mean over N-subsets"
    points = []
    for row in result["rows"]:
        if row["judge_mean"] is None:
            raise ValueError("the best-of-n result has no judge scores (run it with --judge)")
        points.append(FrontierPoint(method, f"N {row['n']}", kl=row["kl_analytic"], judge=row["judge_mean"],
                                    judge_se=row["judge_stderr"], n=config["num_prompts"], kl_analytic=True,
                                    note=note))  # fmt: skip
    return points


def frontier_table(points: Iterable[FrontierPoint]) -> list[str]:
    """Markdown rows: method, setting, KL, judge score +- standard error, completions."""
    lines = ["| method | setting | KL to SFT (nats) | judge score +- s.e. | n | note |", "|---|---|---|---|---|---|"]
    for p in points:
        kl = f"{p.kl:.2f}" + (" (analytic)" if p.kl_analytic else "")
        lines.append(f"| {p.method} | {p.setting} | {kl} | {p.judge:.3f} +- {p.judge_se:.3f} | {p.n} | {p.note} |")
    return lines


def draw_frontier(points: Sequence[FrontierPoint], path: str, title: str = "Judge score against KL to SFT") -> str:
    """Draw every method's points (joined in the given order, error bars = 1 s.e.) to a PNG; returns ``path``.

    The KL axis is linear up to 10 nats and logarithmic beyond (``symlog``), so best-of-N (at most
    a few nats) and an unpenalised PPO run (tens of nats) both stay readable.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not points:
        raise ValueError("no frontier points to draw")
    fig = Figure(figsize=(7, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    methods = list(dict.fromkeys(p.method for p in points))  # first-seen order, for stable colours
    for i, method in enumerate(methods):
        mine = [p for p in points if p.method == method]
        ax.errorbar([p.kl for p in mine], [p.judge for p in mine], yerr=[p.judge_se for p in mine],
                    color=f"C{i}", marker="os^Dv<>p"[i % 8], markersize=5, capsize=2,
                    linestyle="-" if len(mine) > 1 else "none", label=method)  # fmt: skip
        for p in mine:
            if len(mine) > 1:
                ax.annotate(p.setting.split()[-1], (p.kl, p.judge), textcoords="offset points",
                            xytext=(4, -10), fontsize=7, color=f"C{i}")  # fmt: skip
    if max(p.kl for p in points) > 10:
        ax.set_xscale("symlog", linthresh=10)
    ax.set(title=title, xlabel="KL to SFT (nats per response)", ylabel="judge score (held-out prompts)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    return path


def write_frontier(points: Sequence[FrontierPoint], out_dir: str) -> tuple[str, list[str]]:
    """``frontier.png`` and ``frontier.json`` in ``out_dir``; returns the PNG path and the markdown table."""
    os.makedirs(out_dir, exist_ok=True)
    png = draw_frontier(points, os.path.join(out_dir, "frontier.png"))
    with open(os.path.join(out_dir, "frontier.json"), "w", encoding="utf-8") as f:
        json.dump([p.__dict__ for p in points], f, indent=1)
    return png, frontier_table(points)

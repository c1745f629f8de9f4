"""Per-rollout metrics of the PPO stage: phase timing, rollout statistics, text metrics, the compiled
paths' compile cost (``compile/decode_*``, ``compile/forward_*``), assembly.

Everything here runs once per rollout, after the update, never inside the minibatch loop. The
statistics stay tensors on the device until :func:`reduce_over_ranks`, which averages them over
ranks in one collective and brings them to the host in one copy. The response texts (for the
judge and distinct-n, :func:`rlhf_lit.evaluation.response_texts`) cost one more device-to-host
copy of the token ids per rollout.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Literal

import torch
from lightning.pytorch.strategies import Strategy

from rlhf_lit.evaluation import distinct_n, distinct_n_factors
from rlhf_lit.functional import KLMode, explained_variance
from rlhf_lit.models.compiled_generation import CompileStats
from rlhf_lit.stages.ppo.rollout import Rollout


class RolloutTimer:
    """Wall-clock time of the rollout phases; synchronises CUDA so GPU work is counted (one sync per mark)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.times = device, {}
        self._last = self._now()

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def mark(self, name: str) -> None:
        """Record the time since the previous mark (or the start) as phase ``name``."""
        now = self._now()
        self.times[name], self._last = now - self._last, now


LOGPROB_GEN_TRAIN_DIFF = "policy/logprob_gen_train_diff"
"""Mean over response tokens of ``|logprob recorded while sampling - logprob of the training pass|``
of the same tokens, under the same weights: the generation / training mismatch (docs/monitoring.md)."""


def rollout_statistics(
    rollout: Rollout,
    entropy: torch.Tensor,
    train_stats: dict[str, torch.Tensor],
    kl_coef: float,
    has_critic: bool = True,
    gen_train_diff: torch.Tensor | None = None,
    kl_mode: KLMode = "reward",
) -> dict[str, torch.Tensor]:
    """This rank's rollout and update statistics, as 0-dim tensors on the device (no host sync).

    Args:
        rollout: the rollout just trained on.
        entropy: ``()`` masked mean entropy of the policy at rollout time.
        train_stats: ``()`` tensors averaged over the minibatches of the update (the ``logged`` of
            :func:`~rlhf_lit.stages.ppo.update.train_on_rollout`'s :class:`~rlhf_lit.stages.ppo.loss.LossStats`).
        kl_coef: the KL coefficient: the one the rollout's rewards were shaped with (``kl_mode`` "reward"), or
            the one of the loss's KL term ("loss").
        has_critic: log the critic's statistics (``value/*``); False for critic-free estimators.
        gen_train_diff: ``()`` logged as :data:`LOGPROB_GEN_TRAIN_DIFF`; None: not logged (nothing
            was recorded while sampling).
        kl_mode: ``kl.mode``. "reward": the KL part of ``objective/rlhf_reward`` is ``-kl_coef`` times the
            KL summed over each response, the penalty its rewards paid; "loss": ``-kl_coef`` times the
            token mean of the KL over the batch's responses, the term the loss adds (each response's
            share: its summed KL over the batch's mean length).
    """
    mask = rollout.response_mask  # (B, R)
    kl_per_response = rollout.kl.sum(1)  # (B,) nats per response
    if kl_mode == "loss":  # the loss pays beta x the token mean: a response's sum is its length times that
        non_score_reward = -kl_coef * kl_per_response / mask.sum(1).float().mean().clamp_min(1.0)  # (B,)
    else:
        non_score_reward = -kl_coef * kl_per_response  # (B,)
    stats = {
        "objective/scores": rollout.raw_scores.mean(),
        # The spread the reward model's scores give the update: near 0, every response gets one reward.
        "objective/scores_std": rollout.raw_scores.float().std(unbiased=False),
        "objective/scores_shaped": rollout.scores.mean(),
        # score + KL part, as TRL defines it; not rewards.sum(1), which reward whitening rescales.
        "objective/rlhf_reward": (rollout.scores + non_score_reward).mean(),
        "objective/non_score_reward": non_score_reward.mean(),
        "objective/kl": kl_per_response.mean(),
        "objective/entropy": entropy,
        "value/explained_variance": explained_variance(rollout.old_values, rollout.returns, mask),
        "response/length": mask.sum(1).float().mean(),
        "response/ended_fraction": rollout.ended.float().mean(),
        **train_stats,
    }
    if gen_train_diff is not None:
        stats[LOGPROB_GEN_TRAIN_DIFF] = gen_train_diff
    if not has_critic:  # no values: explained variance, value loss and value clipping mean nothing
        for key in ("value/explained_variance", "loss/value", "value/clipfrac"):
            stats.pop(key, None)
    return stats


def text_statistics(texts: Sequence[str], judge_scores: Sequence[float] | None = None) -> dict[str, float]:
    """``diversity/distinct_1``, ``diversity/distinct_2`` and its factors ``diversity/distinct_2_within``
    and ``diversity/distinct_2_across`` (:func:`~rlhf_lit.evaluation.diversity.distinct_n_factors`) of
    ``texts`` and, with a judge's scores of them, ``objective/judge``, their mean.

    Distinct-n is pooled over this rank's responses; across ranks the per-rank values are
    averaged (equal to the pooled value only with one rank). The judge mean over ranks is the
    mean over the global batch (every rank has the same number of rows).
    """
    within, across = distinct_n_factors(texts, 2)
    stats = {
        "diversity/distinct_1": distinct_n(texts, 1),
        "diversity/distinct_2": distinct_n(texts, 2),
        "diversity/distinct_2_within": within,
        "diversity/distinct_2_across": across,
    }
    if judge_scores is not None:
        stats["objective/judge"] = sum(judge_scores) / len(judge_scores)
    return stats


CompiledPath = Literal["decode", "forward"]
"""The compiled paths whose cost is logged: ``sampling.decode`` and ``ppo.forward``."""


def compile_statistics(path: CompiledPath, kind: str, stats: CompileStats) -> dict[str, float]:
    """``compile/<path>_graphs`` (graphs compiled so far) and ``compile/<path>_s`` (wall seconds of the
    calls that compiled one) when the path's option ``kind`` is ``compiled``; no keys on the eager path
    (an absent key says nothing was compiled there, a zero would say the compiled path compiled nothing).

    Running totals of this process since it started (a resumed run counts from 0 again): for
    ``decode`` over every compiled ``generate`` call in it (the rollouts', and an
    ``OnlineGeneration`` callback's when it decodes compiled too,
    :func:`~rlhf_lit.models.compiled_generation.compile_stats`), for ``forward`` over the module's
    scoring and minibatch passes. Averaged over ranks with the other metrics. A rise after the first
    rollout is a recompile (a new batch size, a length past a bucket; docs/performance.md).
    """
    if kind != "compiled":
        return {}
    return {f"compile/{path}_graphs": float(stats.graphs), f"compile/{path}_s": stats.compile_calls_s}


def reduce_over_ranks(
    strategy: Strategy, local: dict[str, torch.Tensor | float], device: torch.device
) -> dict[str, float]:
    """Each value averaged over ranks: one collective and one host sync for all of them."""
    stacked = torch.stack([torch.as_tensor(v, dtype=torch.float32, device=device) for v in local.values()])  # (M,)
    reduced = strategy.reduce(stacked, reduce_op="mean")  # (M,)
    return dict(zip(local, reduced.tolist()))


def logged_metrics(
    metrics: dict[str, float], timer: RolloutTimer, learning_rates: Sequence[float], kl_coef: float, global_rows: int
) -> dict[str, float]:
    """The reduced metrics plus ``objective/kl_coef``, ``lr`` (``lr_critic``), ``time/*`` and throughput.

    Args:
        metrics: the output of :func:`reduce_over_ranks`.
        timer: the rollout's phase times.
        learning_rates: the first param group's lr of each optimizer (policy first).
        kl_coef: the coefficient this rollout's rewards were shaped with (before the update).
        global_rows: rows of the rollout over all ranks (for response tokens per second).
    """
    total_time = sum(timer.times.values())
    tokens = metrics["response/length"] * global_rows
    out = {**metrics, "objective/kl_coef": kl_coef, "lr": learning_rates[0]}
    if len(learning_rates) > 1:
        out["lr_critic"] = learning_rates[1]
    out.update({f"time/{k}_s": v for k, v in timer.times.items()})
    out["time/tokens_per_s"] = tokens / total_time if total_time > 0 else 0.0
    return out

"""Best-of-N sampling by a reward model (or a judge), swept over N, with its analytic KL (``rlhf-lit best-of-n``).

M responses are sampled once per prompt (M = the largest N unless ``num_samples`` asks for more),
scored by the reward model (and the judge), and every N of the sweep is evaluated on those same
samples, so the sweep costs one sampling pass. The pick is by the reward model's score, or with
``pick_by="judge"`` by the judge's (best-of-N by the gold score; a reward model is then optional). The estimator ``subsets`` (the default) takes
the exact expectation over all N-subsets of the M samples (``P(sample i is the pick) =
C(rank_i - 1, N - 1) / C(M, N)`` with rank 1 the lowest RM score); ``first_n`` picks the best of
the first N samples (nested prefixes). Ties in the RM score go to the sample drawn first. See
:mod:`rlhf_lit.functional.best_of_n`.

Per N it reports the mean over prompts of the pick's judge score (with its standard error over
prompts), RM score and length, and the analytic KL of best-of-N to the policy,
``log N - (N - 1) / N``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, get_args

import torch

from rlhf_lit.evaluation.frontier import standard_error
from rlhf_lit.evaluation.judges import Judge, JudgeReads
from rlhf_lit.evaluation.policy_metrics import evaluate_policy
from rlhf_lit.functional.best_of_n import BestOfNEstimator, best_of_n_kl, best_of_n_weights
from rlhf_lit.option_values import check_choice

if TYPE_CHECKING:  # annotations only: importing this module loads no model code
    from rlhf_lit.data.prompt_source import Prompts
    from rlhf_lit.data.rendering import TemplateOption
    from rlhf_lit.models.generation import SamplingConfig
    from rlhf_lit.models.precision import SamplingPrecision
    from rlhf_lit.models.scoring import UnfinishedScoring

PickBy = Literal["reward_model", "judge"]
"""Whose score picks the best of N: the reward model's (the default) or the judge's."""

ROW_KEYS = ("n", "kl_analytic", "judge_mean", "judge_stderr", "rm_mean", "rm_stderr", "length_mean", "ended_fraction")
"""The fields of one row of the sweep (``judge_*`` are None without a judge, ``rm_*`` without a reward model)."""


def sweep(
    rm_scores: torch.Tensor | None,
    ns: Sequence[int],
    *,
    judge_scores: torch.Tensor | None = None,
    lengths: torch.Tensor | None = None,
    ended: torch.Tensor | None = None,
    estimator: BestOfNEstimator = "subsets",
    pick_by: PickBy = "reward_model",
) -> list[dict]:
    """One row per N: the best-of-N pick's judge score, RM score, length, and the analytic KL.

    Args:
        rm_scores: ``(P, M)`` reward scores, row p = the M samples of prompt p (None: no reward model).
        ns: the N values, each at most M.
        judge_scores, lengths, ended: ``(P, M)`` per-sample values averaged under the pick's weights.
        estimator: how the pick of N is evaluated on M samples
            (:func:`rlhf_lit.functional.best_of_n.best_of_n_weights`).
        pick_by: whose scores pick (:data:`PickBy`): ``rm_scores`` or ``judge_scores``.
    """
    check_choice("pick_by", pick_by, get_args(PickBy))
    picking = rm_scores if pick_by == "reward_model" else judge_scores
    if picking is None:
        raise ValueError(f"best-of-N by the {pick_by.replace('_', ' ')} needs its scores")
    rows = []
    for n in ns:
        weights = best_of_n_weights(picking, n, estimator)  # (P, M)

        def picked(values: torch.Tensor | None, weights=weights) -> tuple[float, float] | tuple[None, None]:
            if values is None:
                return None, None
            per_prompt = (weights * values.to(torch.float64)).sum(-1).tolist()  # (P,)
            return sum(per_prompt) / len(per_prompt), standard_error(per_prompt)  # sample std / sqrt(P)

        values = (n, best_of_n_kl(n), *picked(judge_scores), *picked(rm_scores), picked(lengths)[0], picked(ended)[0])
        rows.append(dict(zip(ROW_KEYS, values, strict=True)))
    return rows


def best_of_n(
    policy: str,
    reward_model: str | None,
    prompts: Prompts,
    ns: Sequence[int],
    *,
    num_samples: int | None = None,
    judge: Judge | None = None,
    judge_reads: JudgeReads = "response",
    chat_template: TemplateOption = "auto",
    estimator: BestOfNEstimator = "subsets",
    sampling: SamplingConfig | None = None,
    batch_size: int = 64,
    seed: int = 0,
    tokenizer: str | None = None,
    device: str = "cpu",
    unfinished: UnfinishedScoring = "as_sampled",
    precision: SamplingPrecision = "32-true",
    pick_by: PickBy = "reward_model",
) -> dict:
    """Sample ``num_samples`` (default ``max(ns)``) responses per prompt once and sweep best-of-N over ``ns``.

    Args:
        policy: the model to sample from.
        reward_model: the reward model that picks the best response (with ``pick_by="judge"``: optional, its
            scores reported beside the judge's).
        prompts: prompt texts or conversations, a source or a set read for the policy's tokenizer (as
            :func:`rlhf_lit.evaluation.policy_metrics.evaluate_policy` takes them).
        ns: the N values of the sweep.
        num_samples: M, responses sampled per prompt (>= max(ns)).
        judge: a judge (``texts -> scores``) for the gold score of the pick, or None.
        judge_reads: what the judge reads (:data:`~rlhf_lit.evaluation.judges.JudgeReads`).
        chat_template: whether string prompts are rendered with the policy's chat template
            (:data:`~rlhf_lit.data.rendering.TemplateChoice`; the deprecated aliases ``chat_template``
            and ``raw``, removed in 0.3.0, are ``always`` and ``never``).
        estimator: ``subsets`` (exact expectation over N-subsets) or ``first_n`` (nested prefixes).
        sampling, batch_size, seed, tokenizer, device, precision: as in
            :func:`rlhf_lit.evaluation.policy_metrics.evaluate_policy` (``precision`` the sampling's alone: the
            RM scores that pick are float32).
        unfinished: how the reward model reads a response without EOS (``as_sampled`` or ``with_eos``,
            :data:`~rlhf_lit.models.scoring.UnfinishedScoring`): use the PPO run's ``reward.unfinished``
            to pick with the reward PPO optimises.
        pick_by: whose score picks the best (:data:`PickBy`): the reward model's, or the judge's.

    Returns:
        ``{"rows", "timing_s", "prompt_texts", "samples"}``: ``rows`` one dict per N (:data:`ROW_KEYS`),
        ``prompt_texts`` each prompt as the policy read it, samples
        one per response with ``prompt_index``, ``sample_index``, ``response``, ``rm``, ``judge``,
        ``length``, ``ended``.
    """
    check_choice("pick_by", pick_by, get_args(PickBy))
    if (reward_model if pick_by == "reward_model" else judge) is None:
        raise ValueError(f"best-of-N by the {pick_by.replace('_', ' ')} needs one (pick_by={pick_by!r})")
    ns = sorted(set(ns))
    m = num_samples or ns[-1]
    if ns[0] < 1 or ns[-1] > m:
        raise ValueError(f"best-of-N needs 1 <= N <= {m} (the samples per prompt); got N in {ns}")
    t0 = time.perf_counter()
    # The M samples of every prompt, measured as an evaluation measures them: prompt p's are rows [p*M, (p+1)*M).
    evaluated = evaluate_policy(
        policy,
        prompts,
        reward_model=reward_model,
        judge=judge,
        judge_reads=judge_reads,
        chat_template=chat_template,
        samples_per_prompt=m,
        sampling=sampling,
        batch_size=batch_size,
        seed=seed,
        tokenizer=tokenizer,
        device=device,
        unfinished=unfinished,
        precision=precision,
    )
    samples, timing = evaluated["samples"], evaluated["timing_s"]

    def grid(key: str) -> torch.Tensor:
        return torch.tensor([s[key] for s in samples], dtype=torch.float64).view(-1, m)  # (P, M)

    judge_scores = None if judge is None else grid("judge")
    rm_scores = None if reward_model is None else grid("rm")
    rows = sweep(
        rm_scores,
        ns,
        judge_scores=judge_scores,
        lengths=grid("length"),
        ended=grid("ended"),
        estimator=estimator,
        pick_by=pick_by,
    )
    kept = ("response", "rm", "judge", "length", "ended")  # judge None without a judge, rm without a reward model
    return {
        "rows": rows,
        "timing_s": {
            **{k: timing[k] for k in ("load", "generate")},
            "score": timing["logprobs"],
            "judge": timing["judge"],
            "total": time.perf_counter() - t0,
        },
        "prompt_texts": [s["prompt_text"] for s in samples[::m]],
        "samples": [
            {"prompt_index": i // m, "sample_index": i % m, **{k: s.get(k) for k in kept}}
            for i, s in enumerate(samples)
        ],
    }


def format_table(rows: Sequence[dict]) -> str:
    """The sweep as a plain-text table, one line per N."""
    header = ["N", "KL(analytic)", "judge", "+-stderr", "RM", "+-stderr", "length"]
    keys = ["n", "kl_analytic", "judge_mean", "judge_stderr", "rm_mean", "rm_stderr", "length_mean"]
    cells = [
        [str(r["n"]), *("-" if r[k] is None else f"{r[k]:.4f}" for k in keys[1:-1]), f"{r['length_mean']:.1f}"]
        for r in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(cell, widths)) for cell in cells]
    return "\n".join(lines)

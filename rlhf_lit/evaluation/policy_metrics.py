"""Evaluating a policy on prompts: judge score, RM score, KL to a reference, distinct-n, length.

:func:`evaluate_policy` is what ``rlhf-lit evaluate`` runs; any other evaluation of a policy on a
prompt list (a held-out set of one's own) calls it the same way. Every model is optional but the policy: without a
reference there is no KL, without a reward model no RM score, without a judge no judge score;
length, the fraction of responses that end with EOS and distinct-1/2 are always measured. KL is the
per-response sum over response tokens (EOS included) of ``logprob_policy - logprob_ref`` on the
policy's own samples at the sampling temperature: a Monte Carlo estimate of
``KL(policy || reference)`` of whole responses, the quantity PPO's penalty controls.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rlhf_lit.evaluation.judges import Judge, JudgeReads, judge_scores
from rlhf_lit.evaluation.samples import check_positive, load_models, mean_std, sample_and_measure

if TYPE_CHECKING:  # annotations only: importing this module loads no model code
    from rlhf_lit.data.prompt_source import Prompts
    from rlhf_lit.data.rendering import TemplateOption
    from rlhf_lit.models.generation import SamplingConfig
    from rlhf_lit.models.precision import SamplingPrecision
    from rlhf_lit.models.scoring import UnfinishedScoring


def evaluate_policy(
    policy: str,
    prompts: Prompts,
    *,
    reference: str | None = None,
    reward_model: str | None = None,
    judge: Judge | None = None,
    judge_reads: JudgeReads = "response",
    chat_template: TemplateOption = "auto",
    samples_per_prompt: int = 1,
    sampling: SamplingConfig | None = None,
    batch_size: int = 64,
    seed: int = 0,
    tokenizer: str | None = None,
    device: str = "cpu",
    unfinished: UnfinishedScoring = "as_sampled",
    precision: SamplingPrecision = "32-true",
) -> dict:
    """Sample ``samples_per_prompt`` responses per prompt from ``policy`` and measure them.

    Args:
        policy: the model directory (or hub name) to evaluate.
        prompts: prompt texts or conversations, a :class:`~rlhf_lit.data.prompt_source.PromptSource` (a path:
            a file or hub dataset; a fit config's held-out split) read for the policy's tokenizer, or a
            :class:`~rlhf_lit.data.prompt_source.PromptSet` read for it
            (:func:`~rlhf_lit.data.prompt_source.read_prompt_source`).
        reference: the reference model for the KL (none: no KL).
        reward_model: a reward model for the RM score (none: no RM score).
        judge: a judge (``texts -> scores``, or a reward-model export: :func:`rlhf_lit.evaluation.load_judge`;
            asked through :func:`~rlhf_lit.evaluation.judges.judge_scores`, on ``device``) or None.
        judge_reads: what a function judge reads (:data:`~rlhf_lit.evaluation.judges.JudgeReads`); a
            reward-model judge reads each prompt as the policy read it and the response.
        chat_template: whether string prompts are rendered with the policy's chat template
            (:data:`~rlhf_lit.data.rendering.TemplateChoice`; the deprecated aliases ``chat_template``
            and ``raw``, removed in 0.3.0, are ``always`` and ``never``).
        samples_per_prompt: responses per prompt, as consecutive rows.
        sampling: :class:`~rlhf_lit.models.generation.SamplingConfig` (default: 48 new tokens, T = 1).
        batch_size: responses per ``generate`` call (changing it changes the samples of a seed).
        seed: sampling seed (:func:`rlhf_lit.models.generation.sample_batches`).
        tokenizer: tokenizer location when not beside the policy; every model reads its ids.
        device: torch device.
        unfinished: how the reward model reads a response without EOS (``as_sampled`` or ``with_eos``,
            :data:`~rlhf_lit.models.scoring.UnfinishedScoring`).
        precision: how the policy samples, ``32-true`` or ``bf16-mixed`` (bf16 autocast around ``generate``:
            :data:`~rlhf_lit.models.precision.SamplingPrecision`); the KL, RM and judge scores are float32 either way.

    Returns:
        ``{"metrics", "timing_s", "samples"}``. ``metrics``: ``judge_mean``/``judge_std`` (with a
        judge), ``rm_mean``/``rm_std`` (with an RM), ``kl_mean``/``kl_std`` (with a reference),
        ``distinct_1``, ``distinct_2`` and its factors ``distinct_2_within`` / ``distinct_2_across``
        (:func:`~rlhf_lit.evaluation.diversity.distinct_n_factors`), ``length_mean`` (response tokens, EOS included),
        ``ended_fraction``, ``other_turn_fraction`` (responses holding another turn's role markers,
        :mod:`rlhf_lit.evaluation.turns`), ``num_samples``; stds are population stds over responses. Each
        sample: ``prompt_index``, ``prompt`` (as given), ``prompt_text`` (as the policy read it),
        ``response``, ``judge``, ``rm``, ``kl`` (those measured), ``length``, ``ended``, ``other_turn``.
    """
    from rlhf_lit.evaluation.diversity import distinct_n, distinct_n_factors
    from rlhf_lit.models.generation import SamplingConfig

    check_positive(samples_per_prompt=samples_per_prompt, batch_size=batch_size)
    sampling = sampling or SamplingConfig(max_new_tokens=48)
    t0 = time.perf_counter()
    models = load_models(
        policy,
        reference=reference,
        reward_model=reward_model,
        tokenizer=tokenizer,
        device=device,
        prompts=prompts,
        chat_template=chat_template,
        repeat=samples_per_prompt,
    )
    t_loaded = time.perf_counter()

    repeated = [p for p in models.given or () for _ in range(samples_per_prompt)]
    samples, t_generate = sample_and_measure(
        models, models.prompts, sampling, batch_size=batch_size, seed=seed, unfinished=unfinished, precision=precision
    )
    t_scored = time.perf_counter()
    judged = None if judge is None else judge_scores(judge, samples.prompts, samples.responses, judge_reads, device)
    t_judged = time.perf_counter()

    scores = {k: v for k, v in (("judge", judged), ("rm", samples.rm_scores), ("kl", samples.kls)) if v is not None}
    metrics = {f"{k}_{stat}": x for k, values in scores.items() for stat, x in zip(("mean", "std"), mean_std(values))}
    n = len(samples.responses)
    metrics.update(
        {
            "distinct_1": distinct_n(samples.responses, 1),
            "distinct_2": distinct_n(samples.responses, 2),
            **dict(zip(("distinct_2_within", "distinct_2_across"), distinct_n_factors(samples.responses, 2))),
            "length_mean": sum(samples.lengths) / n,
            "ended_fraction": sum(samples.ended) / n,
            "other_turn_fraction": sum(samples.other_turns) / n,
            "num_samples": n,
        }
    )
    rows = [
        {
            "prompt_index": i // samples_per_prompt,
            "prompt": repeated[i],
            "prompt_text": samples.prompts[i],
            "response": samples.responses[i],
            **{k: values[i] for k, values in scores.items()},
            "length": samples.lengths[i],
            "ended": samples.ended[i],
            "other_turn": samples.other_turns[i],
        }
        for i in range(n)
    ]
    return {
        "metrics": metrics,
        "timing_s": {
            "load": t_loaded - t0,
            "generate": t_generate,
            "logprobs": t_scored - t_loaded - t_generate,
            "judge": t_judged - t_scored,
            "total": t_judged - t0,
        },
        "samples": rows,
    }


def format_table(result: dict) -> str:
    """The metrics and timings of an evaluation result as a plain-text table."""
    rows = [(k, f"{v:.4f}" if isinstance(v, float) else str(v)) for k, v in result["metrics"].items()]
    rows += [(f"time_{k}_s", f"{v:.2f}") for k, v in result["timing_s"].items()]
    width = max(len(k) for k, _ in rows)
    lines = [f"{'metric':<{width}}  value", f"{'-' * width}  {'-' * 10}"]
    lines += [f"{k:<{width}}  {v}" for k, v in rows]
    return "\n".join(lines)


def format_comparison(results: dict[str, dict]) -> str:
    """Several evaluation results (``name -> result``) as one plain-text table, one row per result."""
    metrics = list(dict.fromkeys(k for result in results.values() for k in result["metrics"]))
    cells = [[name] + [_cell(result["metrics"].get(k)) for k in metrics] for name, result in results.items()]
    header = ["policy", *metrics]
    widths = [max(len(row[i]) for row in [header, *cells]) for i in range(len(header))]
    lines = ["  ".join(f"{c:<{w}}" for c, w in zip(row, widths)).rstrip() for row in [header, *cells]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value) -> str:
    return "-" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)

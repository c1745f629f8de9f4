"""Evaluate a policy on held-out prompts: judge score, KL to the reference, diversity, length.

The measuring is :func:`rlhf_lit.evaluation.policy_metrics.evaluate_policy` (also ``rlhf-lit evaluate``):
KL is the per-response sum over response tokens (EOS included) of ``logprob_policy -
logprob_ref`` on the policy's own samples, a Monte Carlo estimate of ``KL(policy || reference)``
of whole responses, the quantity PPO's penalty controls. Both logprobs use the sampling
temperature (``softmax(logits / T)``, over the whole vocabulary as in PPO) and ``position_ids =
cumsum(mask) - 1`` (:func:`rlhf_lit.models.teacher_forced.response_logprobs`). This module picks the
demo's prompts (paragraph openings of a held-out range) and keeps the demo's JSON layout.
"""

from __future__ import annotations

import dataclasses
import logging

from demo.story_prompts import RANGES, load_prompts
from rlhf_lit.artifacts import write_json_atomically
from rlhf_lit.evaluation.judges import DEFAULT_JUDGE, load_judge
from rlhf_lit.evaluation.policy_metrics import evaluate_policy, format_table  # noqa: F401 (format_table: the demo's CLI)
from rlhf_lit.models.generation import SamplingConfig

log = logging.getLogger(__name__)

MIN_SAMPLES = 256
"""Fewer completions than this give noisy means (a warning is logged)."""


def evaluate(
    policy: str,
    reference: str,
    paragraphs: str,
    *,
    start: int = RANGES["eval"][0],
    count: int = RANGES["eval"][1],
    num_words: int = 8,
    samples_per_prompt: int = 1,
    judge: str = DEFAULT_JUDGE,
    sampling: SamplingConfig = SamplingConfig(max_new_tokens=48),
    batch_size: int = 64,
    seed: int = 0,
    tokenizer: str | None = None,
    device: str = "cpu",
    out: str | None = None,
) -> dict:
    """Sample from ``policy`` on paragraphs ``[start, start + count)`` and measure.

    Args:
        policy: the model directory to evaluate (the SFT model itself gives the baseline).
        reference: the frozen reference (SFT) model directory for the KL.
        paragraphs: blank-line separated text file of stories.
        start, count: paragraph range of the prompts (default: the held-out eval range).
        num_words: words of each paragraph used as the prompt.
        samples_per_prompt: completions per prompt.
        judge: judge spec ``module:function``.
        sampling: sampling settings (keep them equal across the runs you compare).
        batch_size: completions per ``generate`` call (changing it changes the samples of a seed).
        seed: sampling seed (see :func:`rlhf_lit.models.generation.sample_batches`).
        tokenizer: tokenizer location when not beside the policy; both models use it.
        device: torch device.
        out: JSON file to write the result to (optional).

    Returns:
        ``{"config", "metrics", "timing_s", "samples"}``; ``metrics`` has ``judge_mean``,
        ``judge_std``, ``kl_mean``, ``kl_std``, ``distinct_1``, ``distinct_2``, ``length_mean``
        (response tokens, EOS included), ``ended_fraction`` and ``num_samples``.
    """
    if samples_per_prompt < 1:
        raise ValueError(f"samples_per_prompt must be >= 1, got {samples_per_prompt}")
    judge_fn = load_judge(judge)
    indices, prompts = load_prompts(paragraphs, start, count, num_words)
    if len(prompts) * samples_per_prompt < MIN_SAMPLES:
        log.warning("only %d completions: means are noisy below %d", len(prompts) * samples_per_prompt, MIN_SAMPLES)
    measured = evaluate_policy(
        policy,
        prompts,
        reference=reference,
        judge=judge_fn,
        samples_per_prompt=samples_per_prompt,
        sampling=sampling,
        batch_size=batch_size,
        seed=seed,
        tokenizer=tokenizer,
        device=device,
    )
    result = {
        "config": {
            "policy": policy,
            "reference": reference,
            "judge": judge,
            "paragraphs": paragraphs,
            "start": start,
            "count": count,
            "num_words": num_words,
            "samples_per_prompt": samples_per_prompt,
            "sampling": dataclasses.asdict(sampling),
            "batch_size": batch_size,
            "seed": seed,
            "device": device,
        },
        "metrics": measured["metrics"],
        "timing_s": measured["timing_s"],
        "samples": [
            {
                "paragraph": indices[s["prompt_index"]],
                "prompt": s["prompt"],
                "response": s["response"],
                "judge": s["judge"],
                "kl": s["kl"],
                "length": s["length"],
                "ended": s["ended"],
            }
            for s in measured["samples"]
        ],
    }
    if out is not None:
        write_json_atomically(out, result)
    return result

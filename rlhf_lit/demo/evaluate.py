"""Evaluate a policy on held-out prompts: judge score, KL to the reference, diversity, length.

KL is the per-response sum over response tokens (EOS included) of
``logprob_policy - logprob_ref`` on the policy's own samples: a Monte Carlo estimate of
``KL(policy || reference)`` of whole responses, the quantity PPO's penalty controls. Both
logprobs use the sampling temperature (``softmax(logits / T)``, the distribution the tokens were
drawn from, over the whole vocabulary as in PPO) and ``position_ids = cumsum(mask) - 1``
(:func:`rlhf_lit.models.generation.response_logprobs`). Sampling and decoding are the
library's, as in the PPO stage.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time

import torch

from rlhf_lit.demo.batching import sample_batches
from rlhf_lit.demo.prompts import RANGES, load_prompts
from rlhf_lit.evaluation import response_texts
from rlhf_lit.evaluation.diversity import distinct_n
from rlhf_lit.evaluation.judges import DEFAULT_JUDGE, load_judge
from rlhf_lit.models import load_causal_lm
from rlhf_lit.models.generation import SamplingConfig, response_logprobs
from rlhf_lit.tokenizer import load_tokenizer

log = logging.getLogger(__name__)

MIN_SAMPLES = 256
"""Fewer completions than this give noisy means (a warning is logged)."""


def _mean_std(xs: list[float]) -> tuple[float, float]:
    mean = sum(xs) / len(xs)
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))


def _check_same_tokenizer(tokenizer, reference: str) -> None:
    """Raise if the reference ships a tokenizer with another vocabulary than the policy's.

    KL compares logprobs of the same token ids, so both models must share one vocabulary. A
    reference directory without tokenizer files is taken to use the policy's tokenizer.
    """
    try:
        ref_tok = load_tokenizer(reference)
    except (OSError, ValueError):
        log.info("no tokenizer in %s: assuming it uses the policy's", reference)
        return
    if ref_tok.get_vocab() != tokenizer.get_vocab():
        raise ValueError(
            f"the reference {reference!r} has another tokenizer vocabulary than the policy "
            f"({len(ref_tok)} vs {len(tokenizer)} tokens); KL needs one vocabulary"
        )


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
        seed: sampling seed (see :func:`rlhf_lit.demo.batching.sample_batches`).
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
    t0 = time.perf_counter()
    judge_fn = load_judge(judge)
    indices, prompts = load_prompts(paragraphs, start, count, num_words)
    if len(prompts) * samples_per_prompt < MIN_SAMPLES:
        log.warning("only %d completions: means are noisy below %d",
                    len(prompts) * samples_per_prompt, MIN_SAMPLES)
    tok = load_tokenizer(tokenizer or policy, padding_side="left")
    model = load_causal_lm(policy, tok).to(device).eval()
    _check_same_tokenizer(tok, reference)
    ref = load_causal_lm(reference, tok).to(device).eval()
    t_loaded = time.perf_counter()

    repeated = [p for p in prompts for _ in range(samples_per_prompt)]
    batches = sample_batches(model, tok, repeated, sampling, batch_size=batch_size, seed=seed)
    t_generated = time.perf_counter()

    kls, lengths, ended, responses = [], [], [], []
    for gen in batches:
        with torch.no_grad():
            logprobs = response_logprobs(model, gen, sampling.temperature)  # (B, R)
            ref_logprobs = response_logprobs(ref, gen, sampling.temperature)  # (B, R)
        kl = torch.where(gen.response_mask, logprobs - ref_logprobs, 0.0).sum(-1)  # (B,)
        kls += kl.tolist()
        lengths += gen.response_mask.sum(-1).tolist()
        ended += gen.ended.tolist()
        responses += response_texts(tok, gen.query_responses, gen.attention_mask, gen.response_mask, gen.ended)
    t_scored = time.perf_counter()

    scores = judge_fn(responses)
    t_judged = time.perf_counter()

    judge_mean, judge_std = _mean_std(scores)
    kl_mean, kl_std = _mean_std(kls)
    result = {
        "config": {
            "policy": policy, "reference": reference, "judge": judge, "paragraphs": paragraphs,
            "start": start, "count": count, "num_words": num_words,
            "samples_per_prompt": samples_per_prompt, "sampling": dataclasses.asdict(sampling),
            "batch_size": batch_size, "seed": seed, "device": device,
        },
        "metrics": {
            "judge_mean": judge_mean, "judge_std": judge_std, "kl_mean": kl_mean, "kl_std": kl_std,
            "distinct_1": distinct_n(responses, 1), "distinct_2": distinct_n(responses, 2),
            "length_mean": sum(lengths) / len(lengths), "ended_fraction": sum(ended) / len(ended),
            "num_samples": len(responses),
        },
        "timing_s": {
            "load": t_loaded - t0, "generate": t_generated - t_loaded,
            "logprobs": t_scored - t_generated, "judge": t_judged - t_scored,
            "total": t_judged - t0,
        },
        "samples": [
            {"paragraph": indices[i // samples_per_prompt], "prompt": repeated[i],
             "response": responses[i], "judge": scores[i], "kl": kls[i], "length": lengths[i],
             "ended": ended[i]}
            for i in range(len(responses))
        ],
    }
    if out is not None:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1, ensure_ascii=False)
    return result


def format_table(result: dict) -> str:
    """The metrics and timings of an :func:`evaluate` result as a plain-text table."""
    metrics = result["metrics"]
    rows = [(k, f"{v:.4f}" if isinstance(v, float) else str(v)) for k, v in metrics.items()]
    rows += [(f"time_{k}_s", f"{v:.2f}") for k, v in result["timing_s"].items()]
    width = max(len(k) for k, _ in rows)
    lines = [f"{'metric':<{width}}  value", f"{'-' * width}  {'-' * 10}"]
    lines += [f"{k:<{width}}  {v}" for k, v in rows]
    return "\n".join(lines)

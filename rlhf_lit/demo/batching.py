"""The demo's one addition to the library's sampling: prompt strings in left-padded batches.

Sampling, decoding and logprobs are the library's (:func:`rlhf_lit.models.generation.generate_responses`,
:func:`rlhf_lit.evaluation.response_texts`, :func:`rlhf_lit.models.generation.forward_with_positions`);
this module only cuts a list of prompt strings into batches and feeds them one seeded generator.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rlhf_lit.models.generation import Generated, SamplingConfig, generate_responses, stop_token_ids


def sample_batches(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    sampling: SamplingConfig,
    *,
    batch_size: int,
    seed: int,
) -> list[Generated]:
    """One response per entry of ``prompts`` (repeat a prompt to get K), ``batch_size`` rows a batch.

    Every batch samples through :func:`generate_responses` from one ``torch.Generator`` seeded
    with ``seed`` (each batch draws its own sampling seed from it), so a call is reproducible,
    the global RNG is untouched, and changing ``batch_size`` changes the samples of a seed.

    Args:
        model: causal LM in eval mode.
        tokenizer: its tokenizer, padding on the left (``load_tokenizer(..., padding_side="left")``).
        prompts: prompt texts; row ``i`` of the concatenated batches answers ``prompts[i]``.
        sampling: the library's sampling settings.
        batch_size: prompts per ``generate`` call (>= 1).
        seed: seed of the generator.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if tokenizer.padding_side != "left":
        raise ValueError("sample_batches needs a left-padding tokenizer: generate continues the last column")
    generator = torch.Generator().manual_seed(seed)
    stop_ids = stop_token_ids(model, tokenizer)
    batches = []
    for start in range(0, len(prompts), batch_size):
        encoded = tokenizer(list(prompts[start : start + batch_size]), return_tensors="pt", padding=True)
        batches.append(generate_responses(
            model, encoded["input_ids"].to(model.device), encoded["attention_mask"].to(model.device), sampling,
            eos_token_id=stop_ids, pad_token_id=tokenizer.pad_token_id, generator=generator,
        ))  # fmt: skip
    return batches

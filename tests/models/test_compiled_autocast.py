"""``sampling.decode: compiled`` under bf16 autocast (``--precision bf16-mixed``, ``trainer.precision:
bf16-mixed``) on a float32 model.

Under autocast the model hands its cache keys in float32 (rotated by RoPE's float32 ``cos`` / ``sin``)
and values in bfloat16 (the value projection's output). The eager path's growing cache stores both in
float32 (``torch.cat`` promotes the values onto its empty float32 start), while a static cache that
allocates both in the keys' dtype and writes the values as they come fails on the first value written
(``index_copy_(): self and source expected to have the same dtype``). The compiled path's
:func:`~rlhf_lit.models.compiled_generation.static_cache` must store what the eager cache stores.

The cache is checked on an eager prefill (no compile); one ``slow`` test compiles the 2-layer
stories260K's decode step (tests/conftest.py's ``two_layer_stories``) under autocast and samples
through :func:`~rlhf_lit.models.generation.sample_batches`. Its tokens are not compared with the
eager path's: bf16 roundings in another order move the logits by a tenth of a nat and more, enough to
change a draw.
"""

from __future__ import annotations

import pytest
import torch
from generation_helpers import EOS, PAD, STORY_PROMPTS, eos_biased_policy, prompt_batch
from transformers import DynamicCache

from rlhf_lit.models.compiled_generation import compile_stats, static_cache
from rlhf_lit.models.generation import SamplingConfig, generate_responses, sample_batches
from rlhf_lit.models.precision import sampling_precision

R = 12


def static_input_type(tensor: torch.Tensor) -> str | None:
    """How ``torch._dynamo.mark_static_address`` marked ``tensor`` (None: not marked): a marked tensor
    keeps its address across compiled calls, which CUDA graphs need of every cache tensor."""
    return getattr(tensor, "_dynamo_static_input_type", None)


def test_static_cache_stores_keys_and_values_in_the_dtypes_of_the_eager_cache_under_autocast(policy, tokenizer):
    batch = prompt_batch(tokenizer, STORY_PROMPTS)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    prompt_length = ids.shape[1]
    dynamic, static = DynamicCache(config=policy.config), static_cache(policy, prompt_length, R)
    with torch.no_grad(), sampling_precision("bf16-mixed", "cpu"):
        for cache in (dynamic, static):  # a prefill, as generate runs it (eager on both paths)
            policy(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
    assert len(static.layers) == policy.config.num_hidden_layers
    for eager, kept in zip(dynamic.layers, static.layers, strict=True):
        assert (eager.keys.dtype, eager.values.dtype) == (torch.float32, torch.float32)  # promoted by cat
        assert (kept.keys.dtype, kept.values.dtype) == (eager.keys.dtype, eager.values.dtype)
        assert kept.keys.shape[2] == kept.values.shape[2] == 64  # cache_length(P, R): P + 12 <= 64
        assert static_input_type(kept.values) == static_input_type(kept.keys) == "unguarded"  # CUDA graphs
        assert not kept.values[:, :, prompt_length:].any()  # nothing written past the prompt
    first_eager, first_kept = dynamic.layers[0], static.layers[0]
    # the first layer's keys and values come from the prompt alone (projections, RoPE): the same bits;
    # its values are bfloat16 numbers (the projection's output under autocast), held exactly in float32
    assert torch.equal(first_kept.keys[:, :, :prompt_length], first_eager.keys)
    assert torch.equal(first_kept.values[:, :, :prompt_length], first_eager.values)
    assert torch.equal(first_kept.values, first_kept.values.bfloat16().float())


def test_float32_static_cache_stays_float32(policy, tokenizer):
    """Without autocast keys and values share the model's dtype: the cache is transformers' as it was."""
    batch = prompt_batch(tokenizer, STORY_PROMPTS)
    static = static_cache(policy, batch["input_ids"].shape[1], R)
    with torch.no_grad():
        policy(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], past_key_values=static)
    assert {(layer.keys.dtype, layer.values.dtype) for layer in static.layers} == {(torch.float32, torch.float32)}


@pytest.mark.slow
def test_compiled_sampling_under_bf16_autocast_samples_with_float32_logprobs(tokenizer, two_layer_stories):
    """``sample_batches(..., precision="bf16-mixed")`` with ``decode="compiled"`` samples (one graph
    compiled under autocast); the recorded logprobs are float32 as on the eager path, and a second
    call of the same shapes compiles nothing new."""
    policy = eos_biased_policy(tokenizer, model_path=two_layer_stories)
    sampling = SamplingConfig(max_new_tokens=R, temperature=0.7, decode="compiled")
    prompts = STORY_PROMPTS * 2
    graphs = compile_stats().graphs
    (generated,) = sample_batches(policy, tokenizer, prompts, sampling, batch_size=8, seed=0, precision="bf16-mixed")
    assert compile_stats().graphs == graphs + 1
    batch = prompt_batch(tokenizer, prompts)
    prompt_length = batch["input_ids"].shape[1]
    assert torch.equal(generated.query_responses[:, :prompt_length], batch["input_ids"])
    responses = generated.response_ids
    assert responses.shape == (8, R)
    assert ((responses >= 0) & (responses < policy.config.vocab_size)).all()
    assert (responses[~generated.response_mask] == PAD).all()

    recorded = {}
    for decode in ("eager", "compiled"):
        with sampling_precision("bf16-mixed", "cpu"):
            recorded[decode] = generate_responses(
                policy,
                batch["input_ids"],
                batch["attention_mask"],
                SamplingConfig(max_new_tokens=R, temperature=0.7, decode=decode),
                EOS,
                PAD,
                generator=torch.Generator().manual_seed(1),
                return_logprobs=True,
            )
    compiled = recorded["compiled"]
    assert compiled.logprobs.dtype == compiled.entropy.dtype == recorded["eager"].logprobs.dtype == torch.float32
    assert torch.isfinite(compiled.logprobs).all() and (compiled.logprobs <= 0).all()
    assert compile_stats().graphs == graphs + 1  # same batch size, cache bucket and precision: no recompile

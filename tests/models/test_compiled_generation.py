"""``sampling.decode: compiled`` (static KV cache, ``torch.compile``d decode step) against the eager
path on stories260K cut to 2 of its 5 decoder layers (tests/conftest.py's ``two_layer_stories``: a
decode step of 3 layers fewer for inductor to lower): the same tokens and, within float32 rounding,
the same logprobs and entropies.

The compiled tests share one compiled graph (one batch size, one cache-length bucket): the first
call compiles it (24 s alone on 2 cores with an empty inductor cache, 32 s on 5 layers), so they are
``slow``. Tolerance for the recorded logprobs / entropies: derived in tests/float32_bounds.py from
the largest logit (over the temperature) the eager policy gives on the rows: the compiled kernels sum
in another order, over a cache longer than the sequence (the masked tail adds exact zeros, but
changes the blocking of the reductions). Tokens and masks must be identical.
"""

from __future__ import annotations

import pytest
import torch
from float32_bounds import entropy_bound, largest_logit, logprob_bound
from generation_helpers import EOS, PAD, STORY_PROMPTS, eos_biased_policy, prompt_batch
from transformers import StaticCache

from rlhf_lit.models.compiled_generation import cache_length, compile_stats, static_cache
from rlhf_lit.models.generation import DecodeSettings, SamplingConfig, decode_settings, generate_responses
from rlhf_lit.models.lora import LoRAConfig, adapter_disabled, with_lora
from rlhf_lit.models.teacher_forced import response_logprobs

R = 12


@pytest.fixture(scope="module")
def policy(tokenizer, two_layer_stories):
    """The 2-layer stories260K with a raised EOS logit (:func:`generation_helpers.eos_biased_policy`),
    so rows end at varied steps; this module's own, over tests/models/conftest.py's."""
    model = eos_biased_policy(tokenizer, model_path=two_layer_stories)
    assert model.config.num_hidden_layers == 2
    return model


def test_cache_length_buckets_by_hand():
    """P + R rounded up to a power of two, at least 64."""
    assert cache_length(13, 12) == 64
    assert cache_length(52, 12) == 64
    assert cache_length(53, 12) == 128
    assert cache_length(100, 28) == 128
    assert cache_length(100, 29) == 256


def cache_lengths(cache) -> set[int]:
    """The lengths of a static cache's layers (set before the prefill allocates their tensors)."""
    return {layer.max_cache_len for layer in cache.layers}


def test_decode_option_is_checked_and_eager_adds_no_settings(tokenizer):
    policy = eos_biased_policy(tokenizer)  # this test's own: a model's static cache never shrinks
    with pytest.raises(ValueError, match="sampling.decode must be 'eager' or 'compiled'"):
        SamplingConfig(decode="fast")  # type: ignore[arg-type]
    assert decode_settings(SamplingConfig(), policy, 13) == DecodeSettings({}, {})
    compiled = decode_settings(SamplingConfig(max_new_tokens=R, decode="compiled"), policy, 13)
    assert set(compiled.config) == {"compile_config"} and set(compiled.inputs) == {"past_key_values"}
    assert compiled.config["compile_config"].mode == "default" and compiled.config["compile_config"].dynamic is False
    assert isinstance(compiled.inputs["past_key_values"], StaticCache)  # generate's own checks look for one
    assert cache_lengths(compiled.inputs["past_key_values"]) == {64}


def test_a_models_static_cache_keeps_the_longest_length_it_was_given(tokenizer):
    """So a shorter prompt after a longer one reuses the longer graph instead of compiling its own."""
    policy, other = eos_biased_policy(tokenizer), eos_biased_policy(tokenizer)
    assert cache_lengths(static_cache(policy, 13, R)) == {64}
    assert cache_lengths(static_cache(policy, 100, R)) == {128}
    assert cache_lengths(static_cache(policy, 13, R)) == {128}
    assert cache_lengths(static_cache(other, 13, R)) == {64}  # per model


def generate(policy, batch, decode, seed=3, **options):
    """One ``generate_responses`` call with the recorder on, seeded by ``seed``; the result remembers
    its temperature (for :func:`assert_same`'s bounds)."""
    sampling = SamplingConfig(max_new_tokens=R, decode=decode, **options)
    generated = generate_responses(
        policy,
        batch["input_ids"],
        batch["attention_mask"],
        sampling,
        EOS,
        PAD,
        generator=torch.Generator().manual_seed(seed),
        return_logprobs=True,
    )
    generated.temperature = sampling.temperature
    return generated


def assert_same(policy, eager, compiled):
    """Identical tokens and masks; logprobs and entropies within the float32 bounds of another
    summation order (tests/float32_bounds.py) at the largest logit / temperature of these rows:
    ~4e-4 nats for the 2-layer stories260K's logits of ~23 at temperature 0.7, where a logprob read one
    position off or with a padding column attended moves by 0.5 nats and more."""
    assert torch.equal(compiled.query_responses, eager.query_responses)
    assert torch.equal(compiled.response_mask, eager.response_mask)
    assert torch.equal(compiled.ended, eager.ended)
    magnitude = largest_logit(policy, eager.query_responses, eager.attention_mask, eager.temperature)
    config = policy.config
    prompt_length = eager.query_responses.shape[1] - eager.response_ids.shape[1]
    positions = cache_length(prompt_length, R)  # the static cache the compiled step attends over
    torch.testing.assert_close(
        compiled.logprobs, eager.logprobs, rtol=0, atol=logprob_bound(config, magnitude, positions)
    )
    largest_entropy = float(eager.entropy.max())
    torch.testing.assert_close(
        compiled.entropy, eager.entropy, rtol=0, atol=entropy_bound(config, magnitude, largest_entropy, positions)
    )


def test_padding_a_batch_would_change_the_real_rows_samples(policy, tokenizer):
    """Why a smaller last batch is not padded up to the batch size of the graph already compiled:
    ``generate`` draws each step's tokens with one ``torch.multinomial`` over the whole batch, so a row
    added after the real ones shifts the real rows' draws from the second step on, and they would no
    longer be the tokens the eager path samples for the same seed."""
    real = prompt_batch(tokenizer, STORY_PROMPTS)
    padded = prompt_batch(tokenizer, [*STORY_PROMPTS, STORY_PROMPTS[0]])  # a copy of a real row after them
    assert torch.equal(padded["input_ids"][:4], real["input_ids"])
    alone, with_copy = (generate(policy, b, "eager", temperature=0.7, ignore_eos=True) for b in (real, padded))
    assert torch.equal(alone.response_ids[:, 0], with_copy.response_ids[:4, 0])  # the first step draws alike
    assert not torch.equal(alone.response_ids, with_copy.response_ids[:4])  # later steps do not


@pytest.mark.slow
@pytest.mark.kernels
def test_greedy_stops_at_eos_with_the_eager_tokens(policy, tokenizer):
    """Greedy, EOS stops each row: rows end at different steps and some run to R."""
    batch = prompt_batch(tokenizer, STORY_PROMPTS * 2)
    eager, compiled = (generate(policy, batch, d, do_sample=False) for d in ("eager", "compiled"))
    lengths = eager.response_mask.sum(1)
    assert eager.ended.any() and not eager.ended.all() and len(set(lengths.tolist())) >= 2
    assert_same(policy, eager, compiled)
    assert compile_stats().graphs >= 1


@pytest.mark.slow
@pytest.mark.kernels
def test_greedy_ignore_eos_runs_past_eos_with_the_eager_tokens(policy, tokenizer):
    batch = prompt_batch(tokenizer, STORY_PROMPTS * 2)
    eager, compiled = (generate(policy, batch, d, do_sample=False, ignore_eos=True) for d in ("eager", "compiled"))
    assert (eager.response_ids[:, :-1] == EOS).any()  # an EOS the rows went on after
    assert compiled.response_mask.all() and not compiled.ended.any()
    assert_same(policy, eager, compiled)


@pytest.mark.slow
@pytest.mark.kernels
@pytest.mark.parametrize("options", [{"temperature": 0.7}, {"temperature": 0.7, "top_k": 5, "top_p": 0.9}])
def test_sampling_with_one_generator_draws_the_eager_tokens_at_two_prompt_lengths(policy, tokenizer, options):
    """Left padding with rows of different lengths, two batches of different prompt lengths (13 and
    16 columns, one cache bucket): the same seed draws the same tokens and records the same logprobs
    within ``TOL``, and the second prompt length compiles nothing new."""
    short = prompt_batch(tokenizer, STORY_PROMPTS * 2)
    long = prompt_batch(tokenizer, [p + " and then" for p in STORY_PROMPTS] * 2)
    assert short["input_ids"].shape[1] != long["input_ids"].shape[1]
    assert not short["attention_mask"][:, 0].all()  # really left padded
    assert_same(policy, generate(policy, short, "eager", **options), generate(policy, short, "compiled", **options))
    graphs = compile_stats().graphs
    eager, compiled = generate(policy, long, "eager", **options), generate(policy, long, "compiled", **options)
    assert_same(policy, eager, compiled)
    assert eager.ended.any() and not torch.equal(eager.response_mask, torch.ones_like(eager.response_mask))
    assert compile_stats().graphs == graphs  # same batch size and cache bucket: no recompile


@pytest.mark.slow
@pytest.mark.kernels
def test_compiled_step_sees_weight_updates_without_recompiling(policy, tokenizer):
    """PPO updates the weights in place between rollouts: the compiled step must read the new values
    (not constants baked in at compile time) and compile nothing new."""
    batch = prompt_batch(tokenizer, STORY_PROMPTS * 2)
    before = generate(policy, batch, "compiled", do_sample=False)
    graphs = compile_stats().graphs
    weight = policy.model.layers[0].mlp.down_proj.weight
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.mul_(-3.0)
        eager, compiled = (generate(policy, batch, d, do_sample=False) for d in ("eager", "compiled"))
        assert_same(policy, eager, compiled)  # the bounds at the updated weights' logits
    finally:
        with torch.no_grad():
            weight.copy_(saved)
    assert (eager.logprobs - before.logprobs).abs().max() > 1e-2  # the update changed the distribution
    assert compile_stats().graphs == graphs


@pytest.mark.slow
@pytest.mark.kernels
def test_lora_policy_compiles_with_its_adapters_and_the_reference_pass_between_rollouts(tokenizer, two_layer_stories):
    """A LoRA policy (PPO's ``lora``): the compiled step runs the adapters (their weights as inputs, so
    an update needs no recompile), and the reference's pass with the adapters disabled between two
    rollouts (``AdapterDisabledReference``, eager) leaves the next compiled call the adapted policy's."""
    lora = with_lora(eos_biased_policy(tokenizer, model_path=two_layer_stories), LoRAConfig(r=4), "causal_lm")
    adapters = [p for n, p in lora.named_parameters() if "lora_B" in n]
    torch.manual_seed(0)
    with torch.no_grad():
        for b in adapters:  # B starts at 0 (the adapted policy equals the base): give it a trained-like value
            b.normal_(0.0, 0.05)
    batch = prompt_batch(tokenizer, STORY_PROMPTS * 2)
    with adapter_disabled(lora):
        base = generate(lora, batch, "eager", do_sample=False)
    eager, compiled = (generate(lora, batch, d, do_sample=False) for d in ("eager", "compiled"))
    assert not torch.equal(eager.query_responses, base.query_responses)  # the adapters change the tokens
    assert_same(lora, eager, compiled)
    graphs = compile_stats().graphs
    with torch.no_grad(), adapter_disabled(lora):  # the reference's logprobs, as PPO scores a rollout
        response_logprobs(lora, compiled, 1.0)
    with torch.no_grad():
        for b in adapters:  # an optimizer step on the adapters, in place
            b.mul_(-1.0)
    before = eager
    eager, compiled = (generate(lora, batch, d, do_sample=False) for d in ("eager", "compiled"))
    assert not torch.equal(eager.query_responses, before.query_responses)  # the update changed the tokens
    assert_same(lora, eager, compiled)
    assert compile_stats().graphs == graphs

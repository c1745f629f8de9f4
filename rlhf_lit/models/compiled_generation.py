"""The settings that make ``generate`` decode with a static KV cache and a ``torch.compile``d step,
and the count of graphs that compiling took.

``SamplingConfig.decode = "compiled"`` (:mod:`rlhf_lit.models.generation`) passes Hugging Face
``generate`` a static KV cache (:func:`static_cache`: a preallocated ``(B, heads, L, head_dim)``
cache per layer, so every decode step has the same shapes) as ``past_key_values`` and the
``CompileConfig`` of :func:`compiled_generate_settings`, which makes ``generate`` run each decode
step through ``torch.compile(model.__call__)`` (transformers' own compiled generation). The prefill (the whole
prompt at once) stays eager: its shape changes with the prompt length. Sampling, the logits
processors (:class:`~rlhf_lit.models.step_logprobs.StepLogprobs` included) and the stop check stay
in ``generate``'s Python loop, outside the compiled graph, so they see the same float32 logits as
on the eager path.

Recompiles are bounded: ``dynamic=False`` specialises a graph to the batch size and the cache
length L, and L is ``P + max_new_tokens`` rounded up to a power of two (:func:`cache_length`), at
least 64; a model's static cache never shrinks between calls (:func:`static_cache` keeps the largest L
it gave the model, as transformers' own ``cache_implementation="static"`` does), so a run compiles at
most once per batch size and per doubling of the longest prompt. The compiled graph reads the
parameters as inputs (inductor's freezing is off), so the optimizer's in-place updates between
rollouts are seen without a recompile.

Under autocast (``trainer.precision: bf16-mixed``, ``--precision bf16-mixed``) a float32 model hands
its cache keys and values of two dtypes: the value projection comes out in bfloat16, while the keys,
rotated by RoPE's float32 ``cos`` / ``sin``, come out in float32. transformers' ``StaticLayer``
allocates both in the keys' dtype and fails on the first value written (``index_copy_``); the eager
path's growing cache stores the values in the keys' dtype too (``torch.cat`` promotes them). The
layers of :func:`static_cache` write the values in the keys' dtype (:class:`ValuesInTheKeysDtype`),
so the compiled path caches what the eager path caches. The autocast state is part of a graph's
guards: sampling at a second precision compiles once more.

On CPU inductor uses ``mode="default"``; on CUDA ``"reduce-overhead"`` adds CUDA graphs (one launch
per decode step instead of one per kernel).
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from weakref import WeakKeyDictionary

import torch
from transformers import CompileConfig, PreTrainedModel, StaticCache, StaticLayer, StaticSlidingWindowLayer

MIN_CACHE_LENGTH = 64
"""The shortest static cache: below it a doubling would cost a recompile for a few tokens."""


def cache_length(prompt_length: int, max_new_tokens: int) -> int:
    """The static cache length for a prompt of ``prompt_length`` tokens: ``P + max_new_tokens``
    rounded up to a power of two, at least :data:`MIN_CACHE_LENGTH` (the few buckets that bound
    recompiles; positions past the sequence are masked, so the length changes no result)."""
    needed = prompt_length + max_new_tokens
    return max(MIN_CACHE_LENGTH, 1 << (needed - 1).bit_length())


_longest_cache: WeakKeyDictionary[PreTrainedModel, int] = WeakKeyDictionary()
"""The longest cache :func:`static_cache` has given each model (a shorter one would compile again)."""


class ValuesInTheKeysDtype:
    """Mixin for a static cache layer: writes the values in the keys' dtype, the dtype the layer
    allocates both in, when that dtype is the wider. Under autocast the keys can be float32 and the
    values bfloat16 (see the module docstring); the eager path's cache stores them so too (its
    ``torch.cat`` onto an empty keys'-dtype tensor promotes the values; bfloat16 to float32 is exact).
    Values wider than the keys are written as they are (and refused by the layer): they are never
    rounded."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """transformers' update, with ``value_states`` promoted to ``key_states``' dtype (a no-op
        without autocast)."""
        promoted = torch.promote_types(key_states.dtype, value_states.dtype)
        return super().update(key_states, value_states.to(promoted), *args, **kwargs)


class KeysDtypeStaticLayer(ValuesInTheKeysDtype, StaticLayer):
    """transformers' full-attention ``StaticLayer`` with :class:`ValuesInTheKeysDtype`."""


class KeysDtypeSlidingWindowLayer(ValuesInTheKeysDtype, StaticSlidingWindowLayer):
    """transformers' ``StaticSlidingWindowLayer`` (sliding and chunked attention) with :class:`ValuesInTheKeysDtype`."""


def keys_dtype_layer(layer):
    """``layer`` of a new ``StaticCache`` as its :class:`ValuesInTheKeysDtype` counterpart, of the same
    length; a layer of another kind (linear attention, no cache) as it is."""
    if type(layer) is StaticLayer:
        return KeysDtypeStaticLayer(max_cache_len=layer.max_cache_len)
    if type(layer) is StaticSlidingWindowLayer:  # its max_cache_len is already min(window, cache length)
        return KeysDtypeSlidingWindowLayer(max_cache_len=layer.max_cache_len, sliding_window=layer.max_cache_len)
    return layer


def static_cache(model: PreTrainedModel, prompt_length: int, max_new_tokens: int) -> StaticCache:
    """A new static cache for one compiled ``generate`` call of ``model`` (its ``past_key_values``):
    :func:`cache_length` long, or as long as the longest one given to ``model`` before; its attention
    layers store the values in the keys' dtype (:class:`ValuesInTheKeysDtype`). The layers allocate
    their tensors lazily, at the prefill, from the batch, heads and keys' dtype written."""
    length = max(cache_length(prompt_length, max_new_tokens), _longest_cache.get(model, 0))
    _longest_cache[model] = length
    cache = StaticCache(config=model.config.get_text_config(decoder=True), max_cache_len=length)
    cache.layers = [keys_dtype_layer(layer) for layer in cache.layers]
    return cache


def compiled_generate_settings(model: PreTrainedModel) -> dict:
    """The ``GenerationConfig`` fields of the compiled path for ``model``: its ``CompileConfig`` (the
    cache is :func:`static_cache`, passed to ``generate`` as ``past_key_values``)."""
    compile_config = CompileConfig(
        fullgraph=True,  # a graph break would silently run part of the step eagerly
        dynamic=False,
        mode="reduce-overhead" if model.device.type == "cuda" else "default",
    )
    # transformers compiles only on accelerators unless told otherwise; on CPU inductor's C++
    # kernels still remove most of the per-op dispatch that dominates a small model's decode step.
    compile_config._compile_all_devices = True
    separate_cache_per_cpu_capability()
    return {"compile_config": compile_config}


def separate_cache_per_cpu_capability() -> None:
    """Gives a process run under ``ATEN_CPU_CAPABILITY`` its own inductor cache directory (unless
    the user set ``TORCHINDUCTOR_CACHE_DIR``).

    torch 2.13's inductor cache does not key on ``ATEN_CPU_CAPABILITY``: a kernel cached by a native
    run (AVX2 ``at::vec`` code) is rebuilt under ``ATEN_CPU_CAPABILITY=default`` with the headers of
    no vector ISA and fails to compile (``'at::vec' has not been declared``).
    """
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir  # noqa: PLC0415

    capability = os.environ.get("ATEN_CPU_CAPABILITY")
    # importing transformers already wrote the default into TORCHINDUCTOR_CACHE_DIR: only a
    # directory the user chose is kept.
    if capability and os.environ.get("TORCHINDUCTOR_CACHE_DIR", default_cache_dir()) == default_cache_dir():
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{default_cache_dir()}_{capability}"


@dataclass
class CompileStats:
    """What compiling the decode step has cost in this process so far.

    Attributes:
        graphs: graphs compiled by ``torch.compile`` while generating (dynamo's ``unique_graphs``
            counter, read before and after each compiled ``generate``): the first call and every
            recompile add one.
        compile_calls_s: wall seconds of the ``generate`` calls that compiled a graph (compile plus
            that call's own decoding: an upper bound of the compile cost).
        calls: compiled ``generate`` calls.
    """

    graphs: int = 0
    compile_calls_s: float = 0.0
    calls: int = 0


COMPILE_STATS = CompileStats()
"""The process's running totals (:func:`compile_stats`)."""


def compile_stats() -> CompileStats:
    """A copy of the process's compiled-generation totals (:class:`CompileStats`)."""
    return CompileStats(COMPILE_STATS.graphs, COMPILE_STATS.compile_calls_s, COMPILE_STATS.calls)


@contextmanager
def counting_compiles(stats: CompileStats | None = None):
    """Counts the graphs compiled inside the block into ``stats`` (default :data:`COMPILE_STATS`,
    the decode path's)."""
    from torch._dynamo.utils import counters  # noqa: PLC0415 (dynamo is imported only on this path)

    stats = COMPILE_STATS if stats is None else stats
    before = counters["stats"]["unique_graphs"]
    start = time.perf_counter()
    try:
        yield
    finally:
        new = counters["stats"]["unique_graphs"] - before
        stats.calls += 1
        if new:
            stats.graphs += new
            stats.compile_calls_s += time.perf_counter() - start

"""The settings that make ``generate`` decode with a static KV cache and a ``torch.compile``d step,
and the count of graphs that compiling took.

``SamplingConfig.decode = "compiled"`` (:mod:`rlhf_lit.models.generation`) passes the settings of
:func:`compiled_generate_settings` to Hugging Face ``generate``: ``cache_implementation="static"``
(a preallocated ``(B, heads, L, head_dim)`` cache per layer, so every decode step has the same
shapes) and a ``CompileConfig`` that makes ``generate`` run each decode step through
``torch.compile(model.__call__)`` (transformers' own compiled generation). The prefill (the whole
prompt at once) stays eager: its shape changes with the prompt length. Sampling, the logits
processors (:class:`~rlhf_lit.models.step_logprobs.StepLogprobs` included) and the stop check stay
in ``generate``'s Python loop, outside the compiled graph, so they see the same float32 logits as
on the eager path.

Recompiles are bounded: ``dynamic=False`` specialises a graph to the batch size and the cache
length L, and L is ``P + max_new_tokens`` rounded up to a power of two (:func:`cache_length`), at
least 64; transformers never shrinks a model's static cache between calls (it keeps the largest L
seen), so a run compiles at most once per batch size and per doubling of the longest prompt. The
compiled graph reads the parameters as inputs (inductor's freezing is off), so the optimizer's
in-place updates between rollouts are seen without a recompile.

On CPU inductor uses ``mode="default"``; on CUDA ``"reduce-overhead"`` adds CUDA graphs (one launch
per decode step instead of one per kernel).
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass

from transformers import CompileConfig, PreTrainedModel

MIN_CACHE_LENGTH = 64
"""The shortest static cache: below it a doubling would cost a recompile for a few tokens."""


def cache_length(prompt_length: int, max_new_tokens: int) -> int:
    """The static cache length for a prompt of ``prompt_length`` tokens: ``P + max_new_tokens``
    rounded up to a power of two, at least :data:`MIN_CACHE_LENGTH` (the few buckets that bound
    recompiles; positions past the sequence are masked, so the length changes no result)."""
    needed = prompt_length + max_new_tokens
    return max(MIN_CACHE_LENGTH, 1 << (needed - 1).bit_length())


def compiled_generate_settings(model: PreTrainedModel, prompt_length: int, max_new_tokens: int) -> dict:
    """The ``GenerationConfig`` fields of the compiled path for ``model`` (see the module docstring)."""
    compile_config = CompileConfig(
        fullgraph=True,  # a graph break would silently run part of the step eagerly
        dynamic=False,
        mode="reduce-overhead" if model.device.type == "cuda" else "default",
    )
    # transformers compiles only on accelerators unless told otherwise; on CPU inductor's C++
    # kernels still remove most of the per-op dispatch that dominates a small model's decode step.
    compile_config._compile_all_devices = True
    separate_cache_per_cpu_capability()
    return {
        "cache_implementation": "static",
        "max_cache_len": cache_length(prompt_length, max_new_tokens),
        "compile_config": compile_config,
    }


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

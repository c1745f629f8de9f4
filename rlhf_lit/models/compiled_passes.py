"""Forward passes over ``(B, P + R)`` prompt-and-response rows run through ``torch.compile`` on a
few padded shapes (:class:`BucketedCompile`).

A compiled graph is specialised to its input shapes (``dynamic=False``: inductor then plans every
buffer and fuses freely). The rows of PPO's scoring and minibatch passes change shape with every
rollout (the longest prompt, the longest response, the left padding a minibatch drops), so each
call pads its rows to the next *bucket* (:func:`bucket_length`) before the compiled call and cuts
the outputs back after it:

- the prompt part on the left, with attention-mask 0 columns: positions come from the attention
  mask, so no real token's position, attention or output changes (the same argument that lets a
  minibatch drop its unattended left padding, :func:`rlhf_lit.stages.ppo.rollout.drop_columns`);
- the response part on the right, with attention-mask 0 columns: a causal model's outputs at
  earlier positions never read later ones, and the outputs at the added positions are cut off, so
  their gradient is zero.

The values are the eager pass's up to the order of float sums (inductor fuses and reorders).
Buckets grow by at most a quarter (four per doubling), so padding costs at most a quarter of a
pass (usually far less: PPO's prompt batches are padded to their longest prompt anyway), and a run
compiles a handful of graphs: one per bucket pair, batch size and grad mode, counted in
:class:`~rlhf_lit.models.compiled_generation.CompileStats`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F

from rlhf_lit.models.compiled_generation import CompileStats, counting_compiles, separate_cache_per_cpu_capability

ForwardPasses = Literal["eager", "compiled"]
"""How the policy and critic forward passes of PPO's scoring and minibatch passes run:
``eager``, op by op as PyTorch dispatches them; ``compiled``, through :class:`BucketedCompile`."""

MIN_BUCKET = 16
"""The shortest bucket: shorter parts are padded to it (a few columns cost less than a graph)."""

RECOMPILE_LIMIT = 64
"""Graphs allowed per compiled function (dynamo's default, 8, would silently fall back to eager
after eight shapes: 8 buckets x 2 grad modes are reached by an ordinary run)."""


def bucket_length(n: int) -> int:
    """``n`` rounded up to its bucket: at least :data:`MIN_BUCKET`; above it, to a multiple of a
    quarter of the power of two that ``n`` reaches (16, 20, 24, 28, 32, 40, 48, 56, 64, 80, ...):
    four buckets per doubling, each at most a quarter longer than what it holds (17 -> 20)."""
    if n <= MIN_BUCKET:
        return MIN_BUCKET
    step = 1 << (n.bit_length() - 3)  # 2**k <= n < 2**(k+1): steps of 2**k / 4
    return -(-n // step) * step


def pad_to_buckets(
    ids: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(B, P + R)`` rows padded to ``(B, bucket(P) + bucket(R))``: prompt columns on the left,
    response columns on the right, all with attention mask 0 and token id 0 (any valid id: never
    attended). Returns the padded ids, the padded mask and the padded prompt length."""
    total = ids.shape[1]
    response_length = total - prompt_length
    left = bucket_length(prompt_length) - prompt_length
    right = bucket_length(response_length) - response_length
    if left == 0 and right == 0:
        return ids, attention_mask, prompt_length
    return F.pad(ids, (left, right), value=0), F.pad(attention_mask, (left, right), value=0), prompt_length + left


class BucketedCompile:
    """``fn(*models, ids, attention_mask, prompt_length)`` compiled, on rows padded to buckets.

    ``fn`` returns a tuple of per-response-position tensors ``(B, R, ...)`` (or None entries);
    each is cut back to the caller's R. Gradients flow to the models' parameters as through ``fn``.

    Args:
        fn: the eager pass (for PPO: :func:`rlhf_lit.stages.ppo.forward.policy_and_values`).
        stats: where the graphs compiled and the seconds of the calls that compiled are added.
    """

    def __init__(self, fn: Callable[..., tuple[torch.Tensor | None, ...]], stats: CompileStats) -> None:
        self.fn = fn
        self.stats = stats
        separate_cache_per_cpu_capability()
        # fullgraph: a graph break would run part of the pass eagerly without saying so.
        self.compiled = torch.compile(fn, dynamic=False, fullgraph=True)

    def __call__(
        self, *models: torch.nn.Module | None, ids: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int
    ) -> tuple[torch.Tensor | None, ...]:
        """The outputs of ``fn(*models, ids, attention_mask, prompt_length)``, within float rounding."""
        response_length = ids.shape[1] - prompt_length
        padded_ids, padded_mask, padded_prompt = pad_to_buckets(ids, attention_mask, prompt_length)
        with counting_compiles(self.stats), torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
            outputs = self.compiled(*models, padded_ids, padded_mask, padded_prompt)
        return tuple(None if out is None else out[:, :response_length] for out in outputs)  # (B, R, ...)

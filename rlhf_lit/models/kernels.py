"""Fused kernels for the same functions: activation modules computed op by op in Python."""

from __future__ import annotations

from torch import nn
from transformers.activations import FastGELUActivation, NewGELUActivation

# GPT-2's "gelu_new" and "gelu_fast" are 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), written
# as five to seven elementwise ops (each a pass over the activations, each saved for backward).
# torch's gelu(approximate="tanh") is that same formula in one kernel forward and one backward
# (torch's nn.GELU module: transformers' own class for it changed names across releases).
_TANH_GELU_AS_OPS = (NewGELUActivation, FastGELUActivation)


def fuse_activations(model: nn.Module) -> int:
    """Replace ``model``'s tanh-GELU activation modules, computed op by op, with the fused kernel.

    The function is the same (outputs agree to float32 rounding); forward and backward of the
    activation take about 40% of the time, which saved 6% of a PPO iteration on a 4-layer GPT-2
    and 5% on gpt2-small (fp32, one CPU thread; README "Performance").
    Weights and config are untouched, so an exported model is the checkpoint's architecture.
    Only these exact classes are replaced (a subclass may compute something else).

    Returns:
        The number of modules replaced.
    """
    replaced = 0
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child) in _TANH_GELU_AS_OPS:
                setattr(parent, name, nn.GELU(approximate="tanh"))
                replaced += 1
    return replaced

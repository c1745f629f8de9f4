"""Float32 bounds for two computations of the same values that differ only in the ORDER of their sums.

A compiled pass (inductor fuses and re-blocks its reductions) against the eager one, a batched pass
against a per-row loop, AVX-512 against AVX2 against the portable kernels: the same real numbers,
other float32 roundings. The tests that compare such pairs take their tolerances from here, so each
tolerance is derived from what is summed and its size, not tuned on one machine.

The derivation, for a transformer output ``y`` of magnitude ``M`` (the largest ``|y|`` compared):

1. A float32 sum of ``n`` terms, computed in any order, differs from the exact sum by less than
   ``sqrt(n) * u * sum |terms|`` with high probability (Higham and Mary, "A new approach to
   probabilistic rounding error analysis", SIAM J. Sci. Comput. 2019; the worst case is ``n * u``,
   reached only when every rounding goes the same way), ``u = eps / 2 = 2**-24`` the unit roundoff.
2. Two orders of the same sum differ by at most twice that.
3. The output passes through ``stages`` such reductions one after another (per decoder layer: two
   RMS norms, the query / key / value projections, the attention scores, the softmax, the
   attention-weighted sum of values, the output projection, the MLP's gate-and-up and down
   projections: :data:`REDUCTIONS_PER_LAYER`; then the final norm and the LM or score head). The
   norms keep each stage's magnitude at the output's scale, and independent rounding errors add in
   quadrature, so ``|y_a - y_b| <= 2 * sqrt(stages * n) * u * M`` = ``sqrt(stages * n) * eps * M``,
   ``n`` the longest reduction (hidden size, MLP width, vocabulary or sequence length).

On stories260K (5 layers, longest reduction 512: ``sqrt(47 * 512) = 155`` eps x M) the compiled and
eager logits were seen 5.4-5.8 eps x M apart under the AVX-512, AVX2 and portable kernels: the bound
holds with a factor ~27 to spare, and the bugs planted to check the tests (a response position off
by one, the padding columns attended) move a response's logprobs by 0.5 to 10 nats, ~1e3 times the
bound for a whole response.

Derived quantities (each function says how): a log-probability ``logit - logsumexp(logits)`` carries
the error of its logit plus that of the logsumexp (at most the largest logit error), so twice the
logit bound; a sum over ``T`` tokens at most ``T`` times the per-token bound.
"""

from __future__ import annotations

import math

import torch

EPS = torch.finfo(torch.float32).eps  # 2**-23 = 2u
"""float32 machine epsilon (twice the unit roundoff)."""

REDUCTIONS_PER_LAYER = 9
"""Float sums one after another in a Llama / GPT-2 decoder layer (the list in the module docstring)."""


def reduction_shape(config) -> tuple[int, int]:
    """``(stages, longest)`` for a Hugging Face decoder ``config``: the reductions an output goes
    through one after another (:data:`REDUCTIONS_PER_LAYER` per layer, + the final norm and the head)
    and the longest of them (hidden size, MLP width, vocabulary, positions)."""
    layers = getattr(config, "num_hidden_layers", None) or config.n_layer
    hidden = getattr(config, "hidden_size", None) or config.n_embd
    width = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * hidden
    positions = getattr(config, "max_position_embeddings", None) or config.n_positions
    return REDUCTIONS_PER_LAYER * layers + 2, max(hidden, width, config.vocab_size, positions)


def output_bound(config, magnitude: float) -> float:
    """The largest difference between two summation orders of one network output of ``magnitude``
    (a logit, a value, a score): ``sqrt(stages * longest) * eps * magnitude`` (module docstring)."""
    stages, longest = reduction_shape(config)
    return math.sqrt(stages * longest) * EPS * magnitude


def logprob_bound(config, logit_magnitude: float) -> float:
    """One token's log-probability ``logit - logsumexp(logits)``: its logit's bound plus the
    logsumexp's (which moves by at most the largest logit's error): twice :func:`output_bound` at the
    largest ``|logit|``."""
    return 2 * output_bound(config, logit_magnitude)


def summed_bound(per_term: float, terms: int) -> float:
    """A sum of ``terms`` values each within ``per_term``: at most ``terms * per_term`` (signs may agree)."""
    return terms * per_term


def whitened_bound(values: torch.Tensor, per_value: float) -> float:
    """How far ``(x - mean) / std`` moves when each of the ``n`` values ``x`` moves by at most
    ``per_value`` (``std`` unbiased): the mean moves by at most ``per_value``, the std by at most
    ``sqrt(n / (n - 1)) * per_value`` (it is ``1 / sqrt(n - 1)``-Lipschitz in the L2 norm, and the
    L2 norm of the move is at most ``sqrt(n) * per_value``), so a whitened value ``w`` moves by at
    most ``(2 + |w| * sqrt(n / (n - 1))) * per_value / std`` to first order; doubled for the second
    order and the float32 rounding of the whitening itself (a few eps, far below)."""
    values = values.double()
    n = values.numel()
    std = float(values.std(correction=1))
    largest = float(((values - values.mean()) / std).abs().max())
    return 2 * (2 + largest * math.sqrt(n / (n - 1))) * per_value / std


def entropy_bound(config, logit_magnitude: float, entropy: float) -> float:
    """The entropy ``H = logsumexp(z) - sum_j p_j z_j`` of a softmax whose logits each move by at most
    ``d`` (:func:`output_bound`): ``dH/dz_j = -p_j (log p_j + H)``, so ``H`` moves by at most
    ``d * sum_j p_j |log p_j + H| <= d * (H + H) = 2 * H * d``, ``H`` the largest entropy compared."""
    return 2 * entropy * output_bound(config, logit_magnitude)


def largest_logit(model, ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0) -> float:
    """The largest ``|logit| / temperature`` of ``model`` (eager, no grad) on left-padded rows (positions
    from the mask, as every pass of rlhf-lit numbers them): the magnitude the logprob bounds take."""
    positions = (attention_mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention_mask, position_ids=positions).logits
    return float(logits.abs().max()) / temperature


def gradient_bound(config, magnitude: float) -> float:
    """A parameter's gradient: the backward pass runs the forward's reductions again in reverse (twice
    the stages), a weight's gradient adding one more over the positions (at most the longest
    reduction): :func:`output_bound` with twice the stages, at ``magnitude`` = the largest gradient
    entry of the model (the backward signal every entry's sums carry)."""
    stages, longest = reduction_shape(config)
    return math.sqrt(2 * stages * longest) * EPS * magnitude

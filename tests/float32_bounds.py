"""Float32 bounds for two computations of the same values that differ only in the ORDER of their sums.

A compiled pass (inductor fuses and re-blocks its reductions) against the eager one, a batched pass
against a per-row loop, AVX-512 against AVX2 against the portable kernels: the same real numbers,
other float32 roundings. The tests that compare such pairs take their tolerances from here, so each
tolerance is derived from what is summed and its size, not tuned on one machine.

The derivation, for a transformer output ``y`` of magnitude ``M`` (the largest ``|y|`` compared):

1. A float32 sum of ``n`` terms carries a rounding error whose size grows as ``sqrt(n) * u`` times
   the magnitude summed when the roundings are independent (Higham and Mary, "A new approach to
   probabilistic rounding error analysis", SIAM J. Sci. Comput. 2019; the worst case, ``n * u``,
   needs every rounding to go the same way), ``u = eps / 2 = 2**-24`` the unit roundoff. Two orders
   of the same sum differ by at most twice that.
2. The output is the end of a chain of such sums (:func:`summed_terms`: per decoder layer the two
   RMS norms, the query / key / value projections, the attention scores, the softmax, the
   attention-weighted sum of values, the output projection, the MLP's gate / up and down
   projections; then the final norm, the head and, for a log-probability, the logsumexp over the
   vocabulary). The norms keep each stage's magnitude at the output's scale, and independent errors
   add in quadrature, so ``|y_a - y_b| <= 2 * sqrt(N) * u * M = sqrt(N) * eps * M``, ``N`` the
   number of terms summed along the chain.

On stories260K (5 layers, 64 wide, 16 positions: ``N`` = 4,260, ``sqrt(N)`` = 65) the compiled and
eager logits were seen 5.4-5.8 eps x M apart under the AVX-512, AVX2 and portable kernels: the bound
holds with a factor ~11 to spare, and the bugs planted to check the tests (a response position off
by one, the padding columns attended) move a response's logprobs by 0.5 to 10 nats, far above it.

Derived quantities (each function says how): a log-probability ``logit - logsumexp(logits)`` carries
the error of its logit plus that of the logsumexp (at most the largest logit error), so twice the
logit bound; a sum over ``T`` tokens at most ``T`` times the per-token bound; a quantity computed
from bounded ones by a formula moves by at most the sum of |its derivative| times their bounds.
"""

from __future__ import annotations

import math

import torch

EPS = torch.finfo(torch.float32).eps  # 2**-23 = 2u
"""float32 machine epsilon (twice the unit roundoff)."""


def summed_terms(config, positions: int) -> int:
    """``N``, the terms an output of a Hugging Face decoder ``config`` sums along its chain of
    reductions (module docstring) on rows of ``positions`` tokens: per layer ``8 * hidden`` (two
    norms, q / k / v, output, gate and up projections) + ``head_dim`` (scores) + ``2 * positions``
    (softmax, weighted sum) + the MLP width (down projection); then the final norm and the head
    (``2 * hidden``) and the vocabulary (the logsumexp of a log-probability; counted for every output)."""
    layers = getattr(config, "num_hidden_layers", None) or config.n_layer
    hidden = getattr(config, "hidden_size", None) or config.n_embd
    heads = getattr(config, "num_attention_heads", None) or config.n_head
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    width = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * hidden
    return layers * (8 * hidden + head_dim + 2 * positions + width) + 2 * hidden + config.vocab_size


def output_bound(config, magnitude: float, positions: int) -> float:
    """The largest difference between two summation orders of one network output of ``magnitude``
    (a logit, a value, a score) on rows of ``positions`` tokens: ``sqrt(N) * eps * magnitude``."""
    return math.sqrt(summed_terms(config, positions)) * EPS * magnitude


def logprob_bound(config, logit_magnitude: float, positions: int) -> float:
    """One token's log-probability ``logit - logsumexp(logits)``: its logit's bound plus the
    logsumexp's (which moves by at most the largest logit's error): twice :func:`output_bound` at the
    largest ``|logit|``."""
    return 2 * output_bound(config, logit_magnitude, positions)


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


def entropy_bound(config, logit_magnitude: float, entropy: float, positions: int) -> float:
    """The entropy ``H = logsumexp(z) - sum_j p_j z_j`` of a softmax whose logits each move by at most
    ``d`` (:func:`output_bound`): ``dH/dz_j = -p_j (log p_j + H)``, so ``H`` moves by at most
    ``d * sum_j p_j |log p_j + H| <= d * (H + H) = 2 * H * d``, ``H`` the largest entropy compared."""
    return 2 * entropy * output_bound(config, logit_magnitude, positions)


def largest_logit(model, ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0) -> float:
    """The largest ``|logit| / temperature`` of ``model`` (eager, no grad) on left-padded rows (positions
    from the mask, as every pass of rlhf-lit numbers them): the magnitude the logprob bounds take."""
    positions = (attention_mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention_mask, position_ids=positions).logits
    return float(logits.abs().max()) / temperature


def gradient_bound(config, magnitude: float, positions: int) -> float:
    """A parameter's gradient: the backward pass runs the forward's sums again in reverse, and a
    weight's gradient adds one more over the batch's positions: ``sqrt(2 N + positions) * eps *
    magnitude``, at ``magnitude`` = the largest gradient entry of the model (the backward signal
    every entry's sums carry) and ``positions`` the tokens of the whole batch."""
    return math.sqrt(2 * summed_terms(config, positions) + positions) * EPS * magnitude


def weighted_abs_grads(model, outputs_and_weights) -> dict[str, torch.Tensor]:
    """``sum_t weight_t |d output_t / d parameter|`` per named parameter of ``model``: how far a
    gradient ``sum_t w_t grad output_t`` moves when each loss weight ``w_t`` moves by at most
    ``weight_t`` (``outputs_and_weights``: pairs of a scalar output with its graph, and a float)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    total = {n: torch.zeros_like(p) for n, p in named}
    for output, weight in outputs_and_weights:
        if weight == 0.0:
            continue
        grads = torch.autograd.grad(output, [p for _, p in named], retain_graph=True, allow_unused=True)
        for (name, _), grad in zip(named, grads):
            if grad is not None:
                total[name] += weight * grad.abs()
    return total


def clipped_bound(
    grads: dict[str, torch.Tensor], bounds: dict[str, torch.Tensor], max_norm: float
) -> dict[str, torch.Tensor]:
    """Gradients clipped to ``max_norm`` (``g * c``, ``c = max_norm / (||g|| + 1e-6)``) when each
    entry of ``g`` moves by at most ``bounds``: ``||g||`` moves by at most ``||bounds||`` (the
    triangle inequality), so ``c`` by ``c * ||bounds|| / ||g||`` to first order (x 1.01), and an entry
    by ``c * (bound + |g| * ||bounds|| / ||g||)``."""
    norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()])))
    move = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(b) for b in bounds.values()])))
    c = max_norm / (norm + 1e-6)
    return {n: c * (bounds[n] + grads[n].abs() * 1.01 * move / norm) for n in grads}


def adam_first_step_bound(grad: torch.Tensor, bound: torch.Tensor, lr: float, eps: float) -> torch.Tensor:
    """How far Adam's first update ``lr * g / (|g| + eps)`` (the bias-corrected moments of one step
    are ``g`` and ``g**2``) moves when ``g`` moves by at most ``bound``: its derivative is
    ``lr * eps / (|g| + eps)**2``, largest where ``|g|`` is smallest, so at most
    ``lr * bound * eps / (max(|g| - bound, 0) + eps)**2``, and never more than ``2 * lr`` (the
    update's range): an entry near 0 may change sign."""
    smallest = (grad.abs() - bound).clamp(min=0)
    return torch.minimum(lr * bound * eps / (smallest + eps) ** 2, torch.full_like(grad, 2 * lr))

"""How each sampled token is drawn from the step's distribution (``SamplingConfig.draw``).

Both draws sample exactly from ``softmax(logits / temperature)`` after top-k / top-p; they differ in cost
and so in which tokens a seed gives:

- ``multinomial``: Hugging Face ``generate`` as it ships, ``torch.multinomial`` on the step's
  probabilities. On a CPU that draws one exponential variate per vocabulary entry: 57 ms a step for 64
  rows of SmolLM2's 49,152 tokens on 2 cores, a quarter of a 48-token reply's sampling time there.
- ``inverse_cdf``: one uniform variate per row against the row's cumulative distribution (float64, so the
  rounding of 49k-200k summed probabilities stays below 1e-12): 2 ms for the same step
  (``bench/chat_levers.py``). ``generate`` then runs its greedy loop, and the processors of
  :func:`draw_processors` apply temperature, top-k and top-p (transformers' own warpers, in ``generate``'s
  order) and pick the drawn token, which the greedy ``argmax`` takes.

The random stream is the global torch RNG in both cases, which
:func:`~rlhf_lit.models.generation.generate_responses` seeds from the caller's generator.
"""

from __future__ import annotations

from typing import Literal

import torch
from transformers import LogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

Draw = Literal["multinomial", "inverse_cdf"]
"""How a token is drawn from a step's distribution (``SamplingConfig.draw``; module docstring)."""
DRAWS: tuple[str, ...] = ("multinomial", "inverse_cdf")


def inverse_cdf_draw(scores: torch.Tensor, uniform: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row of ``scores`` (``(B, V)`` logits, ``-inf`` where a warper removed a token), drawn
    from ``softmax(scores)`` by inverting the cumulative distribution at one uniform variate per row
    (``uniform``, ``(B,)`` in [0, 1); default: drawn from the global torch RNG); returns ``(B,)``.

    The first index whose cumulative probability exceeds ``u * total`` (``right=True``): a token of
    probability 0 adds nothing to the sum, so it is never the first to exceed it.
    """
    probs = torch.softmax(scores.to(torch.float64), dim=-1)  # (B, V)
    cdf = probs.cumsum(dim=-1)  # (B, V)
    if not torch.isfinite(cdf[:, -1]).all():  # NaN / inf logits: torch.multinomial refuses them too
        raise ValueError("sampling: a row's next-token probabilities are not finite (NaN or inf in the logits)")
    if uniform is None:
        uniform = torch.rand(scores.shape[0], dtype=torch.float64, device=scores.device)
    u = uniform.to(torch.float64)[:, None] * cdf[:, -1:]  # (B, 1) in [0, total)
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=scores.shape[-1] - 1)  # (B,)


class InverseCdfDraw(LogitsProcessor):
    """The last logits processor of an ``inverse_cdf`` draw: draws each row's token
    (:func:`inverse_cdf_draw`) and returns scores whose ``argmax`` is that token (0 there, ``-inf`` elsewhere),
    for ``generate``'s greedy loop to take."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """Draw one token per row of ``scores`` ``(B, V)``; returns the one-token scores ``(B, V)``."""
        tokens = inverse_cdf_draw(scores)  # (B,)
        picked = torch.full_like(scores, float("-inf"))
        return picked.scatter_(1, tokens[:, None], 0.0)


def draw_processors(draw: Draw, temperature: float, top_k: int, top_p: float) -> tuple[bool, list[LogitsProcessor]]:
    """``(do_sample, processors)`` for a sampling ``generate`` call: ``multinomial`` leaves the warpers and the
    draw to ``generate`` (``do_sample=True``, no processors); ``inverse_cdf`` decodes greedily
    (``do_sample=False``) through temperature, top-k and top-p warpers (those ``generate`` would add, in its
    order) and :class:`InverseCdfDraw`."""
    if draw == "multinomial":
        return True, []
    warpers: list[LogitsProcessor] = []
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if top_k:
        warpers.append(TopKLogitsWarper(top_k=top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=top_p))
    return False, [*warpers, InverseCdfDraw()]

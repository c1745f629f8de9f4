"""The logprob of each sampled token and the entropy of each step, recorded while ``generate`` samples.

Keeping ``generate``'s logits (``output_logits``) to score the tokens afterwards holds
``(B, R, V)`` floats for the whole batch: 6.6 GB for 64 rows of 200 tokens at a 128k vocabulary.
:class:`StepLogprobs` is a logits processor that turns each step's logits into the two ``(B,)``
numbers PPO reads (the logprob of the token drawn and the entropy) and drops them, so a
generation keeps ``(B, R)`` of each plus the logits of one step.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor

from rlhf_lit.functional import entropy_from_logits, token_logprobs


class StepLogprobs(LogitsProcessor):
    """A logits processor that records, per step, the sampled token's logprob and the entropy under
    ``softmax(logits / temperature)`` of the step's raw logits, the distribution the training pass
    scores (:func:`~rlhf_lit.models.teacher_forced.response_logprobs`); it returns the logits unchanged.

    ``generate`` runs the processors it is given before its sampling warpers (temperature, top-k,
    top-p), so :meth:`__call__` sees the float32 logits ``output_logits`` would keep; the values are
    those of :func:`token_logprobs` / :func:`entropy_from_logits` on the stacked logits
    (tests/models/test_step_logprobs.py compares them). The token of a step is known only once it is
    drawn: the next call reads it as the last column of ``input_ids``, and :meth:`finish` the last
    step's from the sequences, so one step's ``(B, V)`` logits wait in between.

    Args:
        temperature: the sampling temperature (> 0) the logits are divided by.
    """

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature
        self._logprobs: list[torch.Tensor] = []  # (B,) per step whose token is known
        self._entropy: list[torch.Tensor] = []  # (B,) per step
        self._pending: torch.Tensor | None = None  # (B, V) the last step's logits, its token not drawn yet

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """Record this step's entropy, score the previous step's token (``input_ids[:, -1]``) and
        keep this step's logits; returns ``scores`` unchanged."""
        if self._pending is not None:
            self._score_pending(input_ids[:, -1])
        self._entropy.append(entropy_from_logits(scores[:, None], self.temperature)[:, 0])  # (B,)
        # A copy: the warpers after this one must not be able to change what is scored.
        self._pending = scores.detach().clone()  # (B, V)
        return scores

    def _score_pending(self, tokens: torch.Tensor) -> None:
        self._logprobs.append(token_logprobs(self._pending[:, None], tokens[:, None], self.temperature)[:, 0])  # (B,)
        self._pending = None

    def finish(self, response_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``(B, R)`` logprobs of ``response_ids`` (the tokens as ``generate`` drew them, pad
        after EOS) and the ``(B, R)`` entropies, one column per step.

        ``generate`` may have run one step more than it returns (CUDA defers its stop check by a
        step and undoes the last one): only the first R steps count.
        """
        steps = response_ids.shape[1]  # R
        if self._pending is not None and len(self._logprobs) < steps:
            self._score_pending(response_ids[:, len(self._logprobs)])
        self._pending = None
        if len(self._logprobs) < steps or len(self._entropy) < steps:
            raise RuntimeError(f"recorded {len(self._logprobs)} steps for {steps} generated tokens")
        logprobs = torch.stack(self._logprobs[:steps], dim=1)  # (B, R)
        entropy = torch.stack(self._entropy[:steps], dim=1)  # (B, R)
        return logprobs, entropy

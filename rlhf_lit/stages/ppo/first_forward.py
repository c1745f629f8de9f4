"""The update's first forward pass doubles as the rollout's scoring pass of its rows
(``ppo.reuse_first_forward``).

Before the first optimizer step the policy and critic still hold the weights that sampled the
rollout, so the first minibatch's training forward computes exactly what the no-grad scoring pass
computes for those rows: their old logprobs, rollout-time entropy and values. So that forward runs
first, with gradients and in train mode (dropout is off in every model, so the outputs are the
scoring pass's up to the order of float sums); its detached outputs are those rows' scores, the
other rows are scored as before, and the update's first minibatch takes the kept outputs for its
loss instead of a second forward. The rows are known before the update because the shuffle stream
is stateless per rollout (:func:`~rlhf_lit.stages.ppo.rollout.shuffled_rows`).

It saves the policy's and the critic's scoring pass over one minibatch of rows per rollout (half of
both passes with two minibatches). The price is memory: one minibatch's graph is held while the
other rows, the reference and the reward model are scored (no-grad passes of
``ppo.score_chunk_size`` rows), where before the two never coexisted. Under FSDP2 the
backward of that graph gathers the weights again after the no-grad passes, as every backward does
(a run moved between one process and ``fsdp2`` resumes bit for bit: tests/cli/test_resume_cli.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from rlhf_lit.functional import entropy_from_logits, token_logprobs
from rlhf_lit.models.memory import train_mode
from rlhf_lit.stages.ppo.rollout import columns_to_drop, leading_padding, shuffled_rows
from rlhf_lit.stages.ppo.seeding import STREAM_SHUFFLE

if TYPE_CHECKING:
    from rlhf_lit.models.generation import Generated
    from rlhf_lit.stages.ppo.config import PPOConfig
    from rlhf_lit.stages.ppo.forward import ForwardPassRunner
    from rlhf_lit.stages.ppo.protocols import RolloutStage


@dataclass
class FirstForward:
    """The policy-and-critic forward of the update's first minibatch, run while the rollout is scored.

    Attributes:
        rows: ``(M,)`` the minibatch's rows in the rollout, on the rollout's device.
        others: ``(B - M,)`` the rollout's other rows, which the scoring passes score.
        response_ids: ``(M, R)`` their responses (the update checks it got the same minibatch).
        logits: ``(M, R, V)`` the policy's response logits, with their graph; None once taken.
        values: ``(M, R)`` the critic's values, with their graph; None without a critic or once taken.
    """

    rows: torch.Tensor
    others: torch.Tensor
    response_ids: torch.Tensor
    logits: torch.Tensor | None
    values: torch.Tensor | None

    def scores(self, temperature: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The rows' old logprobs ``(M, R)``, entropy ``(M, R)`` and values ``(M, R)`` (None without a
        critic), detached: what the no-grad scoring pass gives for them."""
        logits = self.logits.detach()  # (M, R, V)
        values = None if self.values is None else self.values.detach().float()  # (M, R)
        return token_logprobs(logits, self.response_ids, temperature), entropy_from_logits(logits, temperature), values

    def take(self, response_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The kept ``(logits, values)`` for the update's first minibatch, whose responses are
        ``response_ids``; drops this object's references, so the graph lives only as long as the loss.

        Raises:
            RuntimeError: the update drew another minibatch first (a bug: the losses would mix rows).
        """
        if self.logits is None:
            raise RuntimeError("the first forward pass was taken already")
        if not torch.equal(response_ids, self.response_ids):
            raise RuntimeError("the update's first minibatch is not the rows the first forward pass scored")
        out = (self.logits, self.values)
        self.logits = self.values = None
        return out


def reuses_first_forward(ppo: PPOConfig, has_critic: bool) -> bool:
    """``ppo.reuse_first_forward``, where it saves a pass."""
    saves = ppo.old_logprobs == "rescore" or has_critic  # else the scoring runs neither pass
    return ppo.reuse_first_forward and saves


def first_forward(stage: RolloutStage, passes: ForwardPassRunner, minibatch_size: int, gen: Generated) -> FirstForward:
    """The update's first minibatch's forward over the rows of ``gen`` it will hold, as the update
    runs it: the same rows (the epoch-0 order of the rollout's shuffle stream), the same dropped
    left padding (:func:`~rlhf_lit.stages.ppo.rollout.minibatches`), train mode, with gradients."""
    order = shuffled_rows(gen.response_ids.shape[0], stage.stream_generator(STREAM_SHUFFLE))  # (B,)
    order = order.to(gen.response_ids.device)  # (B,)
    rows, others = order[:minibatch_size], order[minibatch_size:]  # (M,), (B - M,)
    mb = gen.rows(rows)
    prompt_length = mb.prompt_length
    n = columns_to_drop(leading_padding(mb.attention_mask, prompt_length), prompt_length)  # as the update drops them
    ids, mask = mb.query_responses[:, n:], mb.attention_mask[:, n:]  # (M, T - n) x2
    trained = [m for m in (stage.policy, stage.critic) if m is not None]
    with train_mode(*trained), torch.enable_grad():
        logits, values = passes.policy_and_values(stage.policy, stage.critic, ids, mask, prompt_length - n)
    return FirstForward(rows, others, mb.response_ids, logits, values)  # (M, R, V), (M, R) or None

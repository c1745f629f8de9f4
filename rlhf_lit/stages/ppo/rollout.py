"""The rollout record (one field per tensor, grouped by role like OpenRLHF's ``Experience``) and
its shuffled minibatches.

Shapes: B rows, P prompt positions (left padded), R response positions. Per-token fields are
indexed by response position ``t``: ``old_logprobs[:, t]`` is the logprob of ``response_ids[:, t]``,
``old_values[:, t]`` the value of the state just before that token, ``rewards[:, t]`` the reward
received for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields, replace

import torch


@dataclass
class Rollout:
    """One batch of sampled responses with everything the PPO update needs."""

    # --- sequences
    query_responses: torch.Tensor  # (B, P + R) long: prompt (left padded) then response, pad after EOS
    attention_mask: torch.Tensor  # (B, P + R) long: prompt mask then response mask
    response_ids: torch.Tensor  # (B, R) long
    response_mask: torch.Tensor  # (B, R) bool: True up to and including the first EOS
    ended: torch.Tensor  # (B,) bool: the response contains EOS
    # --- policy and reference (no grad, at rollout time)
    old_logprobs: torch.Tensor  # (B, R) float
    ref_logprobs: torch.Tensor  # (B, R) float
    # --- critic (no grad, at rollout time)
    old_values: torch.Tensor  # (B, R) float
    # --- reward
    raw_scores: torch.Tensor  # (B,) float: the weighted sum of the reward sources (default: the RM's score)
    scores: torch.Tensor  # (B,) float: after bias, whitening, clipping and the missing-EOS penalty
    kl: torch.Tensor  # (B, R) float: per-token KL estimate to the reference (0 off the mask)
    rewards: torch.Tensor  # (B, R) float: -kl_coef * kl, plus the score on the last response token
    # --- learning targets
    advantages: torch.Tensor  # (B, R) float (whitened when configured)
    returns: torch.Tensor  # (B, R) float: GAE returns, targets of the value loss

    @property
    def batch_size(self) -> int:
        """B, the number of rows."""
        return self.response_ids.shape[0]

    @property
    def prompt_length(self) -> int:
        """P, the padded prompt length."""
        return self.query_responses.shape[1] - self.response_ids.shape[1]

    def select(self, rows: torch.Tensor) -> Rollout:
        """The rows ``rows`` (a ``(M,)`` index tensor) of every field."""
        return Rollout(**{f.name: getattr(self, f.name)[rows] for f in fields(self)})


def minibatches(rollout: Rollout, minibatch_size: int, generator: torch.Generator) -> Iterator[Rollout]:
    """One pass over the rollout in shuffled minibatches of ``minibatch_size`` rows.

    Args:
        rollout: the batch.
        minibatch_size: rows per minibatch; must divide the batch size (no ragged last minibatch,
            whose loss would weigh its rows differently).
        generator: a CPU generator that alone decides the order (reproducible and resumable).

    Each minibatch drops the left-padding columns none of its rows attends (:func:`drop_columns`),
    keeping at least one prompt column.
    """
    if rollout.batch_size % minibatch_size != 0:
        raise ValueError(
            f"the rollout has {rollout.batch_size} rows, not a multiple of the minibatch size {minibatch_size}"
        )
    order = shuffled_rows(rollout.batch_size, generator)  # (B,)
    # (B,) on the CPU: one host sync per pass, none per minibatch
    first = leading_padding(rollout.attention_mask, rollout.prompt_length)
    device_order = order.to(rollout.response_ids.device)  # (B,)
    for start in range(0, rollout.batch_size, minibatch_size):
        rows = order[start : start + minibatch_size]  # (M,)
        mb = rollout.select(device_order[start : start + minibatch_size])
        yield drop_columns(mb, columns_to_drop(first[rows], rollout.prompt_length))


def shuffled_rows(batch_size: int, generator: torch.Generator) -> torch.Tensor:
    """``(B,)`` CPU long: one epoch's row order; minibatch ``i`` is rows ``i * M .. (i + 1) * M - 1`` of it.
    The shuffle stream is stateless per rollout (:mod:`~rlhf_lit.stages.ppo.seeding`), so the scoring
    can know the update's first minibatch before the update draws it (:mod:`~rlhf_lit.stages.ppo.first_forward`)."""
    return torch.randperm(batch_size, generator=generator)  # (B,)


def leading_padding(attention_mask: torch.Tensor, prompt_length: int) -> torch.Tensor:
    """``(B,)`` CPU long: each row's first attended prompt column (its left padding ends there; ``P``
    for a row whose prompt is all padding)."""
    prompt_mask = attention_mask[:, :prompt_length].bool()  # (B, P)
    padding = (~prompt_mask).cumprod(dim=1).sum(dim=1)  # (B,) leading pad columns
    return padding.cpu()


def columns_to_drop(first: torch.Tensor, prompt_length: int) -> int:
    """How many leading columns a minibatch whose rows start at ``first`` (``(M,)``) drops: the
    padding all of them share, keeping at least one prompt column."""
    return min(int(first.min()), prompt_length - 1)


def drop_columns(rollout: Rollout, n: int) -> Rollout:
    """``rollout`` without its first ``n`` sequence columns, which must be padding in every row.

    Padding is never attended (its keys are masked out) and its outputs are never read; positions
    come from the attention mask, not the column index. So every forward and backward of a
    minibatch gives the same values over fewer columns (only the order of float sums may differ),
    which saves the work of the left padding that the minibatch's longest prompt does not need.
    """
    if n <= 0:
        return rollout
    return replace(
        rollout, query_responses=rollout.query_responses[:, n:], attention_mask=rollout.attention_mask[:, n:]
    )


def nonfinite_rollout_parts(rollout: Rollout, reduce_sum) -> list[str]:
    """Which of the rollout's inputs to the update hold NaN or inf on any rank (one collective, one read).

    Args:
        rollout: the scored rollout.
        reduce_sum: sums a tensor over ranks (``lambda t: strategy.reduce(t, reduce_op="sum")``).
    """
    mask = rollout.response_mask  # (B, R)
    zero = torch.zeros((), device=mask.device)
    parts = {
        "reward scores": rollout.raw_scores,
        "policy logprobs": torch.where(mask, rollout.old_logprobs, zero),
        "reference logprobs": torch.where(mask, rollout.ref_logprobs, zero),
        "critic values": torch.where(mask, rollout.old_values, zero),
    }
    bad = torch.stack([(~torch.isfinite(t)).any() for t in parts.values()]).float()  # (4,)
    return [name for name, flag in zip(parts, reduce_sum(bad).tolist()) if flag > 0]

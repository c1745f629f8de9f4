"""The advantage estimator of a PPO run: the one place ``ppo.estimator`` is read.

:class:`AdvantageEstimator` is built once by ``PPOModule`` from its config. It answers the two
questions the module has: does this run have a critic (:attr:`AdvantageEstimator.uses_critic`:
only ``gae``; otherwise no critic is loaded, no value loss is computed and there is one
optimizer), and what are a rollout's advantages and returns (:meth:`AdvantageEstimator.__call__`,
a dispatch to the pure functions of :mod:`rlhf_lit.functional`).

Groups: with ``sampling.samples_per_prompt = k`` each prompt row is repeated k times as
consecutive rows (:func:`repeat_prompts`) before generation, so rows ``[g*k:(g+1)*k]`` are prompt
g's k samples: the layout the group estimators expect. The whole rollout of a rank is one batch
for the estimator (each rank repeats its own prompts, so a group never spans ranks), and the
advantages are computed before the rollout is cut into minibatches.

What the group estimators score: the sequence reward ``rewards.sum(1)``, i.e. the shaped score
minus the KL penalty summed over the response with ``kl.mode: reward`` (the RLOO paper's
sequence reward), exactly the score with ``kl.mode: loss`` (GRPO: the KL is a loss term).

Whitening over several processes: the GAE advantages and REINFORCE++'s returns are whitened with
the ``reduce_sum`` the caller passes (every process's rows with ``ppo.whiten_scope: global``,
:mod:`~rlhf_lit.stages.ppo.ranks`); the group estimators need none, their groups being whole on
one process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlhf_lit.functional import Reducer, gae, masked_whiten
from rlhf_lit.functional.advantages import (
    EstimatorKind,
    grpo_advantages,
    needs_critic,
    needs_groups,
    reinforce_pp_advantages,
    rloo_advantages,
)
from rlhf_lit.stages.ppo.config import PPOConfig


@dataclass(frozen=True)
class AdvantageEstimator:
    """The estimator of a run with its settings (see the module docstring).

    Args:
        ppo: the settings it reads: ``estimator`` (its :attr:`kind`), ``gamma`` (GAE / REINFORCE++ discount),
            ``lam`` (GAE lambda), ``whiten_advantages`` (GAE advantages whitened over the batch).
        samples_per_prompt: k, ``sampling.samples_per_prompt``.
    """

    ppo: PPOConfig = PPOConfig()
    samples_per_prompt: int = 1

    @property
    def kind(self) -> EstimatorKind:
        """``ppo.estimator``."""
        return self.ppo.estimator

    def __post_init__(self) -> None:
        if needs_groups(self.kind) and self.samples_per_prompt < 2:
            raise ValueError(
                f"ppo.estimator={self.kind!r} normalises each response against the other samples of its "
                f"prompt: set sampling.samples_per_prompt >= 2 (got {self.samples_per_prompt})"
            )

    @property
    def uses_critic(self) -> bool:
        """Whether a critic is built and trained (only ``gae``)."""
        return needs_critic(self.kind)

    def __call__(
        self, rewards: torch.Tensor, values: torch.Tensor | None, mask: torch.Tensor, reduce_sum: Reducer | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(advantages, returns)``, both ``(B, R)`` and 0 off ``mask``.

        Args:
            rewards: ``(B, R)`` per-token rewards (score at the last response token, minus the KL
                penalty with ``kl.mode: reward``).
            values: ``(B, R)`` critic values at rollout time (``gae``); None without a critic.
            mask: ``(B, R)`` bool response mask.
            reduce_sum: sums over the processes, for the whitening of ``gae`` (with
                ``whiten_advantages``) and ``reinforce_pp``; None = whiten over these rows.
        """
        if self.kind == "gae":
            assert values is not None, "gae needs the critic's values"
            advantages, returns = gae(rewards, values, mask, self.ppo.gamma, self.ppo.lam)  # (B, R) x2
            if self.ppo.whiten_advantages:
                advantages = masked_whiten(advantages, mask, reduce_sum=reduce_sum)  # (B, R)
            return advantages, returns
        if self.kind == "reinforce_pp":
            return reinforce_pp_advantages(rewards, mask, self.ppo.gamma, reduce_sum)  # (B, R) x2
        sequence_rewards = rewards.sum(1)  # (B,) 0 off the mask, so the score (- the summed KL penalty)
        if self.kind == "rloo":
            return rloo_advantages(sequence_rewards, mask, self.samples_per_prompt)  # (B, R) x2
        scale_by_std = self.kind == "grpo"  # dr_grpo: no std division
        return grpo_advantages(sequence_rewards, mask, self.samples_per_prompt, scale_by_std=scale_by_std)


def repeat_prompts(batch: dict[str, Any], k: int) -> dict[str, Any]:
    """Each prompt row repeated ``k`` times as consecutive rows (``repeat_interleave``).

    Tensors are repeated along dim 0; ``batch["extras"]`` (a dict of per-row lists, e.g. a
    ``ground_truth`` column) is repeated the same way, so row ``g*k + j`` carries prompt g's values.
    """
    if k == 1:
        return batch
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            out[key] = value.repeat_interleave(k, dim=0)  # (B*k, ...)
        elif key == "extras":
            out[key] = {name: [v for v in column for _ in range(k)] for name, column in value.items()}
        else:
            raise TypeError(f"prompt batch field {key!r} of type {type(value).__name__} cannot be repeated per sample")
    return out

"""The calibrated reward of a rollout (``reward.calibration: reference_quantile``): each response's raw
score replaced by its quantile among the raw scores of K responses the frozen reference policy
samples for the same prompt, then transformed (the math: :mod:`rlhf_lit.functional.calibration`).

Per rollout, for the rollout's P prompts (before ``samples_per_prompt`` repeats them):

1. the reference (the frozen SFT copy, or a LoRA policy with its adapters disabled:
   :class:`~rlhf_lit.models.reference.Reference`) samples K = ``reward.calibration_samples``
   responses per prompt with the policy's sampling settings, from the rollout's
   ``STREAM_REFERENCE`` generator (:mod:`~rlhf_lit.stages.ppo.seeding`): the policy's sampling
   and shuffling streams are not touched, so the policy samples what it samples with calibration
   off, and a resumed run draws the same references;
2. the K * P responses get their raw scores as the policy's do: the reward model through the
   stage's ``score`` / ``reward_model_inputs`` seams (in chunks of ``ppo.score_chunk_size``), the
   reward functions on their decoded batch, summed by the same :class:`RewardSources` (an
   ensemble's aggregate, not its members, is what is calibrated: it is the score best-of-N would
   pick by and the policy is trained on);
3. each of the B = P * k policy rows is ranked among its prompt's K reference scores.

Drawn fresh each rollout, not cached per prompt set: prompts are new in every rollout of an epoch,
so a cache would only pay from the second epoch on, and fresh draws are exact for any prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from rlhf_lit.functional import calibrated_scores, reference_quantiles
from rlhf_lit.models.generation import Generated
from rlhf_lit.stages.ppo.config import RewardConfig
from rlhf_lit.stages.ppo.reward_sources import reward_batch
from rlhf_lit.stages.ppo.seeding import STREAM_REFERENCE

if TYPE_CHECKING:
    from rlhf_lit.stages.ppo.protocols import RolloutStage


@dataclass(eq=False)
class ReferenceCalibration:
    """Samples the reference's K responses per prompt and calibrates a rollout's raw scores against them.

    The stage (:class:`~rlhf_lit.stages.ppo.protocols.RolloutStage`) gives the rest when a rollout is
    made: the reference, the policy's sampling settings (the reference samples with them), the stop
    ids, ``ppo.score_chunk_size``, the reward sources and the tokenizer that decodes for them.

    Attributes:
        reward: ``reward`` (its ``calibration_*`` settings).
        sample_fn: draws responses from a model
            (:func:`~rlhf_lit.stages.ppo.experience.sample_responses`'s signature).
    """

    reward: RewardConfig
    sample_fn: Callable[..., Generated]

    @property
    def k(self) -> int:
        """K, the reference samples per prompt."""
        return self.reward.calibration_samples

    def sample(self, stage: RolloutStage, prompts: dict[str, Any]) -> Generated:
        """K responses per prompt from the reference, from this rollout's reference stream."""
        generator = stage.stream_generator(STREAM_REFERENCE)
        # The prompt tensors passed apart: the reference moves tensor arguments to its own device.
        ids, mask = prompts["input_ids"], prompts["attention_mask"]
        return stage.reference.apply(_sample_with, ids, mask, self.sample_fn, stage, generator)

    @torch.no_grad()
    def reference_scores(self, stage: RolloutStage, prompts: dict[str, Any], gen: Generated) -> torch.Tensor:
        """``(P * K,)`` raw scores of the reference responses, as the rollout's raw scores are made."""
        rm_scores = None
        if self.reward.uses_reward_model:
            rows = gen.response_ids.shape[0]
            size = stage.ppo.score_chunk_size or rows
            rm_scores = torch.cat(
                [
                    stage.score(*stage.reward_model_inputs(gen.rows(i, i + size).trimmed())).float()
                    for i in range(0, rows, size)
                ]
            )  # (P*K,) or (P*K, M)
        decoded = reward_batch(stage.tokenizer, prompts, gen) if stage.reward_sources.needs_texts else None
        raw, _ = stage.reward_sources(rm_scores, decoded)  # (P*K,); each source's parts are the policy rows' to log
        return raw

    def draw(self, stage: RolloutStage, prompts: dict[str, Any]) -> torch.Tensor:
        """``(P, K)`` raw scores of K reference responses to each of P prompts.

        Args:
            prompts: the P prompts each repeated K times as consecutive rows (prompt g's at
                ``g*K:(g+1)*K``; :func:`~rlhf_lit.stages.ppo.estimator.repeat_prompts` with :attr:`k`).
        """
        gen = self.sample(stage, prompts)
        return self.reference_scores(stage, prompts, gen).view(-1, self.k)  # (P, K)

    def calibrate(
        self, raw_scores: torch.Tensor, reference: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(calibrated (B,), parts)``: the rollout's raw scores calibrated against their prompts' references.

        Args:
            raw_scores: ``(B,)`` the policy rows' raw scores, ``samples_per_prompt`` consecutive rows per prompt.
            reference: ``(P, K)`` from :meth:`draw`.

        Returns the calibrated scores and, to log, ``reward/calibrated``, ``reward/quantile`` (the
        mid-quantile: the chance of beating a reference response, 1/2 for the reference itself) and
        ``reward/reference`` (the reference responses' raw scores).
        """
        per_row = reference.to(raw_scores.device).repeat_interleave(
            raw_scores.shape[0] // reference.shape[0], 0
        )  # (B, K)
        if torch.isfinite(raw_scores).all() and torch.isfinite(per_row).all():
            calibrated = calibrated_scores(
                raw_scores, per_row, self.reward.calibration_transform, self.reward.calibration_n
            )  # (B,)
            quantiles = reference_quantiles(raw_scores, per_row).float()  # (B,)
        else:
            # No quantile for a NaN: the rollout is made non-finite, which the stage skips and counts
            # (max_skipped_updates) as it does a non-finite raw score.
            calibrated = quantiles = torch.full_like(raw_scores, float("nan"))  # (B,)
        return calibrated, {
            "reward/calibrated": calibrated,
            "reward/quantile": quantiles,
            "reward/reference": reference.flatten(),
        }


def _sample_with(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    sample_fn: Callable[..., Generated],
    *args: Any,
) -> Generated:
    """``sample_fn(model, prompt batch, *args)``, the batch rebuilt from tensors the reference has moved."""
    return sample_fn(model, {"input_ids": input_ids, "attention_mask": attention_mask}, *args)

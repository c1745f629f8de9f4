"""What the experience maker and the update read of the PPO stage while they run, named.

:class:`~rlhf_lit.stages.ppo.module.PPOModule` is both a :class:`RolloutStage` and an
:class:`UpdateStage`; a test may hand either part a smaller object. The makers read these public
attributes and seams of the stage each time they run (a test's or a callback's change is the one
used), never a private attribute; the Trainer is passed to
:meth:`~rlhf_lit.stages.ppo.experience.ExperienceMaker.make` when it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from lightning.pytorch import Trainer
    from transformers import PreTrainedTokenizerBase

    from rlhf_lit.functional import KLController
    from rlhf_lit.models.generation import Generated, SamplingConfig
    from rlhf_lit.models.reference import Reference
    from rlhf_lit.stages.ppo.config import KLConfig, PPOConfig, RewardConfig
    from rlhf_lit.stages.ppo.estimator import AdvantageEstimator
    from rlhf_lit.stages.ppo.forward import ForwardPassRunner
    from rlhf_lit.stages.ppo.loss import LossStats
    from rlhf_lit.stages.ppo.reward_sources import RewardSources
    from rlhf_lit.stages.ppo.rollout import Rollout


class RolloutStage(Protocol):
    """What :class:`~rlhf_lit.stages.ppo.experience.ExperienceMaker` reads of the stage while it runs.

    Attributes:
        policy: the trained policy (sharded in place under FSDP, moved to the stage's device).
        critic: the value model (a separate critic or the policy's value head); None without one.
        reference: the frozen reference policy (its logprobs; a calibrated reward's samples).
        tokenizer: the run's tokenizer (decodes the responses).
        stop_ids: the ids that end a response.
        response_end_id: the id the reward model reads after a cut response (``reward.unfinished: with_eos``).
        sampling, ppo, reward_cfg, kl_cfg: the ``sampling``, ``ppo``, ``reward`` and ``kl`` settings.
        kl_ctl: the KL controller (its coefficient shapes the rewards).
        estimator: the advantage estimator (``ppo.estimator``).
        reward_sources: the loaded reward sources (the raw score).
        forward_passes: the policy-and-critic passes as ``ppo.forward`` runs them.
    """

    policy: torch.nn.Module
    critic: torch.nn.Module | None
    reference: Reference
    tokenizer: PreTrainedTokenizerBase
    stop_ids: tuple[int, ...]
    response_end_id: int
    sampling: SamplingConfig
    ppo: PPOConfig
    reward_cfg: RewardConfig
    kl_cfg: KLConfig
    kl_ctl: KLController
    estimator: AdvantageEstimator
    reward_sources: RewardSources
    forward_passes: ForwardPassRunner

    def generate(self, batch: dict[str, torch.Tensor]) -> Generated:
        """Sample responses to the prompts of ``batch`` (with their logprobs while sampling)."""
        ...

    def score(self, query_responses: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The reward model's normalised score ``(B,)`` of each row, an ensemble's ``(B, M)``."""
        ...

    def reward_model_inputs(self, gen: Generated) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows the reward model reads of a generated batch (``(ids, mask)``)."""
        ...

    def stream_generator(self, stream: int) -> torch.Generator:
        """A fresh generator for this rollout's ``stream`` (:mod:`~rlhf_lit.stages.ppo.seeding`)."""
        ...

    def frozen_submodules(self) -> dict[str, torch.nn.Module]:
        """The frozen models registered as submodules (freed of gathered weights after scoring)."""
        ...


class UpdateStage(Protocol):
    """What :func:`~rlhf_lit.stages.ppo.update.train_on_rollout` reads of the stage.

    Attributes:
        ppo: the update's settings (epochs, minibatch size, gradient accumulation).
    """

    ppo: PPOConfig

    @property
    def trainer(self) -> Trainer:
        """The Trainer (its precision plugin: one loss scale for both optimizers under fp16)."""
        ...

    def optimizer_list(self) -> list:
        """The optimizers stepped together (one or two)."""
        ...

    def stream_generator(self, stream: int) -> torch.Generator:
        """As :meth:`RolloutStage.stream_generator`: the minibatches' shuffle stream."""
        ...

    def minibatch_loss(self, mb: Rollout, passes: tuple | None) -> tuple[torch.Tensor, LossStats]:
        """A minibatch's loss and statistics; ``passes``: its ``(logits, values)`` computed already."""
        ...

    def manual_backward(self, loss: torch.Tensor) -> None:
        """Backward through the strategy (gradient sync, loss scaling)."""
        ...

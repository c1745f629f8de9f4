"""Training a reward-model ensemble in one run: the ``ensemble`` setting of the reward-model stage.

With ``ensemble.members: M > 1`` the stage trains M separate reward models (``design: separate``):
each a full copy of the start model with its own score-head initialisation (its seed) and, with
``data_weights: bootstrap``, its own Poisson(1) weight on every pair (ranking: every prompt) of
every batch: online bagging (Oza & Russell 2001), so each member sees its own resample of the data
(measured worse than ``uniform`` on the demo's data: docs/reward_model.md).
All members see the same batches, in one forward pass each. The loss that is differentiated is the
SUM of the members' losses and ``trainer.gradient_clip_val`` clips each member's gradient norm on its
own (:meth:`EnsembleHead.clip_gradients`): the members share no parameter, so member m takes exactly
the steps the single reward model with its seed (and weights) would take. ``train/loss`` logs the
members' mean.

Why separate members and not M heads on one shared trunk: measured on the demo's data
(docs/reward_model.md, "Ensembles"; ``bench/reward_ensemble_design.py``): M heads on one trunk
came out near-copies (score correlation 0.997, members' std a fifth of separate members', no larger
on the pairs the ensemble gets wrong), separate members disagree more where the ensemble is wrong.

Each member is normalised on the reference set with its own gain and bias (the stage's
``normalize``), so members on different scales do not dominate the ensemble's std or minimum. The
export is a directory of M Hugging Face reward models plus ``ensemble.json``
(:mod:`rlhf_lit.models.reward_ensemble`). ``members: 1`` is the single reward model (the plain head),
with its export format.
"""

from __future__ import annotations

import copy
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import nn
from torchmetrics import MeanMetric

from rlhf_lit.functional import batch_examples, is_ranking_batch, member_std
from rlhf_lit.models import init_reward_head, score_head
from rlhf_lit.models.reward_ensemble import RewardEnsemble
from rlhf_lit.option_values import check_choice
from rlhf_lit.run_seed import seed_or_run_seed
from rlhf_lit.stages.reward_heads.head import Batch, Log, LossAndStatistics, Sequences, TrainingStep, preference_loss
from rlhf_lit.stages.reward_heads.validation import RankingValidation

EnsembleDesign = Literal["separate"]
"""``separate``: M full reward models, each from the start model (the measured choice; see the module docstring)."""

DataWeights = Literal["uniform", "bootstrap"]
"""``uniform``: every member weighs every pair 1 (members differ by their head initialisation only);
``bootstrap``: each member draws a Poisson(1) weight per pair (ranking: per prompt) and batch."""


@dataclass(frozen=True)
class EnsembleConfig:
    """An ensemble of reward models trained in one run (``model.init_args.ensemble``).

    Args:
        members: M, the number of reward models; 1 = the single reward model (the plain head and its export).
        design: see :data:`EnsembleDesign`.
        seeds: each member's seed (its head initialisation and bootstrap draws); None = the run seed
            (``seed_everything``) + m for member m.
        data_weights: see :data:`DataWeights`.
    """

    members: int = 1
    design: EnsembleDesign = "separate"
    seeds: list[int] | None = None
    data_weights: DataWeights = "uniform"

    def __post_init__(self) -> None:
        if not isinstance(self.members, int) or self.members < 1:
            raise ValueError(f"ensemble.members must be an integer >= 1, got {self.members!r}")
        check_choice("ensemble.design", self.design, get_args(EnsembleDesign))
        check_choice("ensemble.data_weights", self.data_weights, get_args(DataWeights))
        if self.seeds is not None and len(self.seeds) != self.members:
            raise ValueError(f"ensemble.seeds must list one seed per member ({self.members}), got {len(self.seeds)}")
        if self.members == 1 and (self.seeds is not None or self.data_weights != "uniform"):
            raise ValueError("ensemble.seeds and ensemble.data_weights apply to ensemble.members > 1")

    def member_seeds(self) -> list[int]:
        """The seeds of the members, resolved (:mod:`rlhf_lit.run_seed`)."""
        if self.seeds is not None:
            return list(self.seeds)
        base = seed_or_run_seed(None)
        return [base + m for m in range(self.members)]


def bootstrap_weight(seed: int, prompts: int, epoch: int, batch_idx: int, rank: int, device) -> torch.Tensor:
    """``(prompts,)`` Poisson(1) counts, a function of (member seed, epoch, batch, rank) alone: the
    same on a resumed run."""
    key = zlib.crc32(f"{seed}/{epoch}/{batch_idx}/{rank}".encode())
    generator = torch.Generator().manual_seed(key)
    return torch.poisson(torch.ones(prompts), generator=generator).to(device)  # (B,)


def member_losses(
    scores: torch.Tensor, batch: Batch, weights: list[torch.Tensor | None]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The members' losses and pair accuracies, ``(M,)`` each: member m's from its column of
    ``scores (N, M)`` and its ``weights[m]`` (None: unweighted), pairs or rankings alike."""
    losses, accuracies = zip(*(preference_loss(scores[:, m], batch, weight) for m, weight in enumerate(weights)))
    return torch.stack(losses), torch.stack(accuracies)  # (M,), (M,)


class EnsembleHead(nn.Module):
    """M separate reward models (:class:`~rlhf_lit.stages.reward_heads.head.RewardHead`; the module
    docstring): scores ``(N, M)``, the sum of the members' losses, each member clipped, normalised
    and exported on its own."""

    lora_refusal = None  # LoRA puts adapters on every member, each exported merged
    fsdp_refusal = (  # members train on one device or under DDP; FSDP shards one model
        "ensemble.members > 1 is not supported under fsdp / fsdp2 (each member would need its own "
        "sharding); use one device or --trainer.strategy ddp"
    )

    def __init__(self, config: EnsembleConfig) -> None:
        super().__init__()
        self.config = config
        self.normalization_shape = (config.members,)
        self.loss_metric, self.accuracy, self.std = MeanMetric(), MeanMetric(), MeanMetric()
        self.member_accuracy = nn.ModuleList([MeanMetric() for _ in range(config.members)])
        self.ranking = RankingValidation()

    def build(self, model: nn.Module, new_head: bool, adapt: Callable[[nn.Module], nn.Module]) -> RewardEnsemble:
        """M members from the loaded start ``model`` (copied), each head initialised from its seed
        when the start model had none (a sequence-classification start keeps its head in every member,
        so then only the bootstrap weights tell members apart), then ``adapt`` (LoRA, checkpointing)."""
        seeds = self.config.member_seeds()
        members = [model] + [copy.deepcopy(model) for _ in seeds[1:]]  # all copied before any is adapted
        for member, seed in zip(members, seeds):
            if new_head:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(seed)
                    init_reward_head(score_head(member))
        return RewardEnsemble([adapt(member) for member in members], self.config.design, seeds)

    def scores(self, model: RewardEnsemble, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Each member's score, ``(N, M)``."""
        return model.raw_scores(input_ids, attention_mask)  # (N, M)

    def loss(self, model: RewardEnsemble, sequences: Sequences, batch: Batch, step: TrainingStep) -> LossAndStatistics:
        """The sum of the members' losses (each member gets its own loss's gradient); logs their mean,
        the accuracy of the members' mean score and each member's accuracy."""
        scores = self.scores(model, *sequences)  # (N, M)
        B = batch_examples(batch)
        weights = [None] * model.size
        if self.config.data_weights == "bootstrap":
            weights = [bootstrap_weight(seed, B, *step, scores.device) for seed in model.seeds]
        losses, accuracies = member_losses(scores, batch, weights)  # (M,), (M,)
        _, accuracy = preference_loss(scores.detach().mean(dim=1), batch)  # (): the ensemble mean's
        stats = {"loss": losses.detach().mean(), "accuracy": accuracy}
        stats.update({f"member_{m}/accuracy": member for m, member in enumerate(accuracies)})
        return losses.sum(), stats  # ()

    def validate(self, scores: torch.Tensor, batch: Batch, log: Log) -> None:
        """Each member's loss and accuracy, the mean score's accuracy (and on ranking batches its
        ``val/ranking_exact`` and ``val/kendall_tau``), and the members' std, of the normalised
        ``scores`` ``(N, M)``."""
        B = batch_examples(batch)
        losses, accuracies = member_losses(scores, batch, [None] * scores.shape[1])  # (M,), (M,)
        _, accuracy = preference_loss(scores.mean(dim=1), batch)  # (): the ensemble mean's
        self.loss_metric.update(losses.mean(), weight=B)
        self.accuracy.update(accuracy, weight=B)
        self.std.update(member_std(scores))  # (N,) per sequence
        log("val/loss", self.loss_metric, prog_bar=True, batch_size=B)
        log("val/accuracy", self.accuracy, prog_bar=True, batch_size=B)
        log("val/std", self.std, batch_size=B)
        for m, (metric, member_accuracy) in enumerate(zip(self.member_accuracy, accuracies)):
            metric.update(member_accuracy, weight=B)
            log(f"val/member_{m}/accuracy", metric, batch_size=B)
        if is_ranking_batch(batch):  # how well the members' mean orders each prompt's responses
            self.ranking.update(scores.mean(dim=1), batch, log)

    def clip_gradients(
        self, model: RewardEnsemble, clip_val: float | None, algorithm: str | None, clip_whole: Callable[[], None]
    ) -> None:
        """``trainer.gradient_clip_val`` applied to each member's gradients on its own (norm or value),
        as M single runs would."""
        if clip_val is None or clip_val == 0:
            return
        clip = torch.nn.utils.clip_grad_value_ if algorithm == "value" else torch.nn.utils.clip_grad_norm_
        for member in model.members:
            clip(member.parameters(), clip_val)

    def ready_for_export(self, model: RewardEnsemble) -> list[nn.Module]:
        """The members, each normalised on its own; the ensemble exports as a directory of them."""
        return list(model.members)

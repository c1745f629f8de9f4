"""Training a reward-model ensemble in one run: the ``ensemble`` setting of the reward-model stage.

With ``ensemble.members: M > 1`` the stage trains M separate reward models (``design: separate``):
each a full copy of the start model with its own score-head initialisation (its seed) and, with
``data_weights: bootstrap``, its own Poisson(1) weight on every pair (ranking: every prompt) of
every batch: online bagging (Oza & Russell 2001), so each member sees its own resample of the data
(measured worse than ``uniform`` on the demo's data: docs/reward_model.md).
All members see the same batches, in one forward pass each. The loss that is differentiated is the
SUM of the members' losses and ``trainer.gradient_clip_val`` clips each member's gradient norm on its
own (:func:`clip_each_member`): the members share no parameter, so member m takes exactly the steps
the single reward model with its seed (and weights) would take. ``train/loss`` logs the members' mean.

Why separate members and not M heads on one shared trunk: measured on the demo's data
(docs/reward_model.md, "Ensembles"; ``bench/reward_ensemble_design.py``): M heads on one trunk
came out near-copies (score correlation 0.997, members' std a fifth of separate members', no larger
on the pairs the ensemble gets wrong), separate members disagree more where the ensemble is wrong.

Each member is normalised on the reference set with its own gain and bias (the stage's
``normalize``), so members on different scales do not dominate the ensemble's std or minimum. The
export is a directory of M Hugging Face reward models plus ``ensemble.json``
(:mod:`rlhf_lit.models.reward_ensemble`). ``members: 1`` is the single reward model, with today's
code path and export format.
"""

from __future__ import annotations

import copy
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

import torch
from torch import nn
from torchmetrics import MeanMetric

from rlhf_lit.functional import batch_examples, is_ranking_batch, member_std
from rlhf_lit.models import init_reward_head, score_head
from rlhf_lit.models.reward_ensemble import RewardEnsemble
from rlhf_lit.models.reward_norm import Normalize, fold_normalization, gain_and_bias, record_normalization
from rlhf_lit.run_seed import seed_or_run_seed

if TYPE_CHECKING:
    from rlhf_lit.stages.reward_model import RewardModelModule

EnsembleDesign = Literal["separate"]
"""``separate``: M full reward models, each from the start model (the measured choice; see the module docstring)."""

DataWeights = Literal["uniform", "bootstrap"]
"""``uniform``: every member weighs every pair 1 (members differ by their head initialisation only);
``bootstrap``: each member draws a Poisson(1) weight per pair (ranking: per prompt) and batch."""


@dataclass(frozen=True)
class EnsembleConfig:
    """An ensemble of reward models trained in one run (``model.init_args.ensemble``).

    Args:
        members: M, the number of reward models; 1 = the single reward model (today's path and export).
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
        if self.design not in get_args(EnsembleDesign):
            raise ValueError(
                f"ensemble.design must be one of {', '.join(get_args(EnsembleDesign))}; got {self.design!r}"
            )
        if self.data_weights not in get_args(DataWeights):
            raise ValueError(
                f"ensemble.data_weights must be one of {', '.join(get_args(DataWeights))}; got {self.data_weights!r}"
            )
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


def build_ensemble(first: nn.Module, new_head: bool, config: EnsembleConfig, adapt) -> RewardEnsemble:
    """M members from the loaded start model ``first`` (copied), each head initialised from its seed
    when the start model had none (a sequence-classification start keeps its head in every member,
    so then only the bootstrap weights tell members apart), then ``adapt`` (LoRA, checkpointing)."""
    seeds = config.member_seeds()
    members = [first] + [copy.deepcopy(first) for _ in seeds[1:]]  # all copied before any is adapted
    for member, seed in zip(members, seeds):
        if new_head:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                init_reward_head(score_head(member))
    return RewardEnsemble([adapt(member) for member in members], config.design, seeds)


def bootstrap_weight(seed: int, prompts: int, epoch: int, batch_idx: int, rank: int, device) -> torch.Tensor:
    """``(prompts,)`` Poisson(1) counts, a function of (member seed, epoch, batch, rank) alone: the
    same on a resumed run."""
    key = zlib.crc32(f"{seed}/{epoch}/{batch_idx}/{rank}".encode())
    generator = torch.Generator().manual_seed(key)
    return torch.poisson(torch.ones(prompts), generator=generator).to(device)  # (B,)


def member_losses(
    module: RewardModelModule, scores: torch.Tensor, batch: dict[str, torch.Tensor], weights: list[torch.Tensor | None]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Each member's ``(loss, pair accuracy)`` from its column of ``scores (N, M)``, through the
    stage's ``preference_loss`` (pairs or rankings alike)."""
    losses, accuracies = [], []
    for m, weight in enumerate(weights):
        if weight is None:
            loss, accuracy = module.preference_loss(scores[:, m], batch)  # (), ()
        else:
            loss, accuracy = module.preference_loss(scores[:, m], batch, weight=weight)  # (), ()
        losses.append(loss)
        accuracies.append(accuracy)
    return losses, accuracies


def training_step(
    module: RewardModelModule, scores: torch.Tensor, batch: dict[str, torch.Tensor], batch_idx: int
) -> torch.Tensor:
    """The sum of the members' losses on raw scores ``(N, M)`` (each member gets its own loss's
    gradient); logs their mean, the accuracy of the members' mean score and each member's accuracy."""
    config = module.ensemble
    B = batch_examples(batch)
    if config.data_weights == "bootstrap":
        weights = [
            bootstrap_weight(seed, B, module.current_epoch, batch_idx, module.global_rank, scores.device)
            for seed in module.model.seeds
        ]
    else:
        weights = [None] * module.model.size
    losses, accuracies = member_losses(module, scores, batch, weights)
    loss = torch.stack(losses)  # (M,)
    _, accuracy = module.preference_loss(scores.detach().mean(dim=1), batch)  # (): the ensemble mean's
    module.log("train/loss", loss.detach().mean(), prog_bar=True, batch_size=B)
    module.log("train/accuracy", accuracy, batch_size=B)
    for m, member_accuracy in enumerate(accuracies):
        module.log(f"train/member_{m}/accuracy", member_accuracy, batch_size=B)
    module.log("lr", module.optimizers().param_groups[0]["lr"], batch_size=B)
    return loss.sum()  # ()


def clip_each_member(ensemble: RewardEnsemble, clip_val: float | None, algorithm: str | None) -> None:
    """``trainer.gradient_clip_val`` applied to each member's gradients on its own (norm or value)."""
    if clip_val is None or clip_val == 0:
        return
    for member in ensemble.members:
        if algorithm == "value":
            torch.nn.utils.clip_grad_value_(member.parameters(), clip_val)
        else:
            torch.nn.utils.clip_grad_norm_(member.parameters(), clip_val)


class ValidationMetrics(nn.Module):
    """The ensemble's validation metrics: each member's loss and accuracy, the mean score's
    accuracy (and on ranking batches its ``val/ranking_exact`` and ``val/kendall_tau``), and the members' std."""

    def __init__(self, members: int) -> None:
        super().__init__()
        self.loss, self.accuracy, self.std = MeanMetric(), MeanMetric(), MeanMetric()
        self.member_accuracy = nn.ModuleList([MeanMetric() for _ in range(members)])

    def step(self, module: RewardModelModule, batch: dict[str, torch.Tensor]) -> None:
        """Update and log from one validation batch, on the normalised scores."""
        scores = module(*module.batch_sequences(batch))  # (N, M) normalised
        B = batch_examples(batch)
        losses, accuracies = member_losses(module, scores, batch, [None] * scores.shape[1])
        _, accuracy = module.preference_loss(scores.mean(dim=1), batch)  # (): the ensemble mean's
        self.loss.update(torch.stack(losses).mean(), weight=B)
        self.accuracy.update(accuracy, weight=B)
        self.std.update(member_std(scores))  # (N,) per sequence
        module.log("val/loss", self.loss, prog_bar=True, batch_size=B)
        module.log("val/accuracy", self.accuracy, prog_bar=True, batch_size=B)
        module.log("val/std", self.std, batch_size=B)
        for m, (metric, member_accuracy) in enumerate(zip(self.member_accuracy, accuracies)):
            metric.update(member_accuracy, weight=B)
            module.log(f"val/member_{m}/accuracy", metric, batch_size=B)
        if is_ranking_batch(batch):  # how well the members' mean orders each prompt's responses
            module.log_ranking_metrics(scores.mean(dim=1), batch)


@torch.no_grad()
def normalize(
    module: RewardModelModule, batches: Iterable[dict[str, torch.Tensor]], reference: str, kind: Normalize
) -> tuple[list[float], list[float]]:
    """Each member's gain and bias so that its reference scores have mean 0 (and std 1); the
    moments are per member (a member on a larger scale gets a smaller gain), summed over processes."""
    M = module.model.size
    moments = torch.zeros(3, M, dtype=torch.float64, device=module.device)  # count, sum, sum of squares
    for batch in batches:
        batch = {k: v.to(module.device) for k, v in batch.items() if isinstance(v, torch.Tensor)}
        if "chosen_input_ids" in batch or is_ranking_batch(batch):
            scores = module.raw_scores(*module.batch_sequences(batch))  # (N, M)
        else:
            scores = module.raw_scores(batch["input_ids"], batch["attention_mask"])  # (N, M)
        scores = scores.double()  # (N, M)
        count = torch.full((M,), float(scores.shape[0]), dtype=torch.float64, device=module.device)  # (M,)
        moments += torch.stack([count, scores.sum(0), (scores**2).sum(0)])  # (3, M)
    if module._trainer is not None:
        moments = module.trainer.strategy.reduce(moments, reduce_op="sum")
    counts, totals, squares = moments.tolist()
    if counts[0] == 0:
        raise ValueError(f"reference set {reference!r} is empty; cannot normalise the reward")
    gains, biases = [], []
    for count, total, square in zip(counts, totals, squares):
        mean = total / count
        gain, bias = gain_and_bias(mean, max(square / count - mean**2, 0.0) ** 0.5, kind)
        gains.append(gain)
        biases.append(bias)
    module.reward_gain.copy_(torch.tensor(gains))
    module.reward_bias.copy_(torch.tensor(biases))
    module.reference_name = reference
    return gains, biases


def fold(module: RewardModelModule) -> None:
    """Fold each member's gain and bias into its weights and record it in its config; the buffers
    keep what could not be folded, so the module's forward still gives the normalised scores."""
    gains, biases = module.reward_gain.tolist(), module.reward_bias.tolist()
    kept = []
    for member, gain, bias in zip(module.model.members, gains, biases):
        folded = fold_normalization(member, gain, bias)
        record_normalization(member.config, gain, bias, module.reference_name, folded)
        kept.append(0.0 if folded else bias)
    module.reward_gain.fill_(1.0)
    module.reward_bias.copy_(torch.tensor(kept))


def refuse_sharding(module: RewardModelModule) -> None:
    """Ensembles train on one device or under DDP; FSDP shards one model (refused before any work)."""
    if getattr(module, "_device_mesh", None) is not None:
        raise ValueError(
            "ensemble.members > 1 is not supported under fsdp / fsdp2 (each member would need its own "
            "sharding); use one device or --trainer.strategy ddp"
        )

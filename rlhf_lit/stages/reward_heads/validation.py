"""The validation metrics of one score per sequence (a reward model's, or an ensemble's mean), pooled
over a validation run: what every head logs under ``val/``."""

from __future__ import annotations

import torch
from torch import nn
from torchmetrics import MeanMetric
from torchmetrics.regression import PearsonCorrCoef

from rlhf_lit.functional import batch_examples, is_ranking_batch, ranking_metrics, ranking_pair_mask
from rlhf_lit.stages.reward_heads.head import Batch, Log, preference_loss, response_lengths


class RankingValidation(nn.Module):
    """``val/ranking_exact`` and ``val/kendall_tau`` of ranking batches
    (:func:`~rlhf_lit.functional.ranking_metrics`), pooled over the prompts that hold a pair."""

    def __init__(self) -> None:
        super().__init__()
        self.exact, self.kendall_tau = MeanMetric(), MeanMetric()

    def update(self, scores: torch.Tensor, batch: Batch, log: Log) -> torch.Tensor:
        """Update and log from a ranking batch's ``scores`` ``(N,)``; returns its prompts' weights ``(B,)``."""
        ranking = ranking_metrics(scores, batch["group"], batch["rank"], batch["responses_per_prompt"])  # (B,) x3
        prompts = ranking.has_pairs.to(scores.dtype)  # (B,)
        self.exact.update(ranking.exact, weight=prompts)
        self.kendall_tau.update(ranking.kendall_tau, weight=prompts)
        B = batch_examples(batch)
        log("val/ranking_exact", self.exact, batch_size=B)
        log("val/kendall_tau", self.kendall_tau, batch_size=B)
        return prompts


class ScoreValidation(nn.Module):
    """A single reward model's ``val/loss`` and ``val/accuracy`` (fraction of pairs with chosen >
    rejected; ranking batches: better > worse over all their pairs) and ``val/margin`` (mean chosen -
    rejected), the ranking metrics of ranking batches, and ``val/length_correlation`` (Pearson's
    correlation of the score with the response length over every response of batches with
    ``prompt_length``). Pair batches weigh by pairs; ranking batches' loss by prompts, accuracy and
    margin by pairs."""

    def __init__(self) -> None:
        super().__init__()
        self.loss, self.accuracy, self.margin = MeanMetric(), MeanMetric(), MeanMetric()
        self.ranking = RankingValidation()
        self.length_correlation = PearsonCorrCoef()

    def update(self, scores: torch.Tensor, batch: Batch, log: Log) -> None:
        """Update and log from the normalised ``scores`` ``(N,)`` of one validation batch."""
        loss, _ = preference_loss(scores, batch)  # ()
        if is_ranking_batch(batch):
            weight = self.ranking.update(scores, batch, log).sum()  # prompts with a pair weigh 1
            pairs = ranking_pair_mask(batch["group"], batch["rank"]).to(scores.dtype)  # (N, N) pairs weigh 1
            diff = scores[:, None] - scores[None, :]  # (N, N) better - worse at [better, worse]
            wins, margins = (diff > 0).to(scores.dtype), torch.where(pairs > 0, diff, 0)  # (N, N) x2
        else:
            B = scores.shape[0] // 2
            chosen, rejected = scores[:B], scores[B:]  # (B,), (B,)
            weight, pairs = B, 1.0
            wins, margins = (chosen > rejected).float(), chosen - rejected  # (B,) x2, per-pair
        self.loss.update(loss, weight=weight)
        self.accuracy.update(wins, weight=pairs)
        self.margin.update(margins, weight=pairs)
        B = batch_examples(batch)
        log("val/loss", self.loss, prog_bar=True, batch_size=B)
        log("val/accuracy", self.accuracy, prog_bar=True, batch_size=B)
        log("val/margin", self.margin, batch_size=B)
        if "prompt_length" in batch:  # batches without it are left out
            lengths = response_lengths(batch).to(scores.device)  # (N,)
            self.length_correlation.update(scores.float(), lengths.float())
            log("val/length_correlation", self.length_correlation, batch_size=B)

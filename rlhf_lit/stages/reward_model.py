"""Reward model (RM): a scalar head on a causal-LM backbone, trained on preference pairs.

Stage 2 of InstructGPT. Details followed ("The N(+) implementation details of RLHF"):

- the score is read at the last real token of prompt + response, found from the attention mask
  (left or right padding, never from pad ids) (#1, #2);
- a fresh head is initialised N(0, 1/sqrt(d + 1)) (#4); a head from a sequence-classification
  checkpoint is kept;
- dropout is off (#8); the recommended schedule is one epoch with the LR annealed to 0 (#6),
  which is this module's default ``optimizer.schedule="linear"``;
- after training the reward is normalised so that a reference set scores mean 0 (#5, InstructGPT's
  bias), optionally std 1 too; the normalisation lives in two buffers and is folded into the
  exported weights (see :mod:`rlhf_lit.models.reward_norm`).

Chosen and rejected sequences go through the model in one forward pass (concatenated along the
batch), which halves the number of calls. A ranking batch (K ranked responses per prompt, marked by
its ``group`` key, docs/CONTRACTS.md) goes through in one forward too, each response once, and is
trained with InstructGPT's loss: the mean over prompts of the mean over each prompt's C(K, 2) pairs.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from typing import Any

import torch
from lightning.pytorch.utilities.model_helpers import is_overridden
from torchmetrics import MeanMetric
from torchmetrics.regression import PearsonCorrCoef
from transformers import AutoConfig

from rlhf_lit.functional import (
    batch_examples,
    concat_pairs,
    is_ranking_batch,
    pairwise_reward_loss,
    ranking_loss,
    ranking_metrics,
    ranking_pair_mask,
)
from rlhf_lit.models import init_reward_head, load_reward_model, score_head, sequence_scores
from rlhf_lit.models.memory import train_mode
from rlhf_lit.models.reward_ensemble import RewardEnsemble
from rlhf_lit.models.reward_norm import Normalize, fold_normalization, gain_and_bias, record_normalization
from rlhf_lit.models.sharding import reshard
from rlhf_lit.sources import from_pretrained
from rlhf_lit.stages import ensemble_training
from rlhf_lit.stages import length_debias as debias
from rlhf_lit.stages.base import PretrainedStage, RunLayout, as_config, require_input
from rlhf_lit.stages.ensemble_training import EnsembleConfig
from rlhf_lit.stages.length_debias import LengthDebiasConfig
from rlhf_lit.stages.optim import OptimizerConfig

log = logging.getLogger(__name__)


def has_trained_score_head(name_or_path: str, revision: str | None = None, trust_remote_code: bool = False) -> bool:
    """True when the checkpoint is a sequence-classification model, i.e. it ships its own score head."""
    config = from_pretrained(
        AutoConfig.from_pretrained, name_or_path, "model", revision=revision, trust_remote_code=trust_remote_code
    )
    return any(a.endswith("ForSequenceClassification") for a in (config.architectures or []))


class RewardModelModule(PretrainedStage):
    """Trains a Bradley-Terry reward model on (chosen, rejected) pairs or on rankings of K responses
    per prompt, and exports it normalised.

    Logs ``train/loss``, ``train/accuracy`` and ``lr`` every step; ``val/loss``, ``val/accuracy``
    (fraction of pairs with chosen > rejected) and ``val/margin`` (mean chosen - rejected) per
    validation run. Validation reads the normalised scores (what the exported model gives). On
    ranking batches the loss is :func:`~rlhf_lit.functional.ranking_loss` (averaged per prompt, then
    over prompts), accuracy and margin are over all pairs of the rankings, and validation also logs
    ``val/ranking_exact`` (fraction of prompts whose responses the scores order exactly) and
    ``val/kendall_tau`` (mean over prompts; see :func:`~rlhf_lit.functional.ranking_metrics`).
    A single reward model also logs ``val/length_correlation``: Pearson's correlation of its score
    with the response length in tokens over every validation response (batches with ``prompt_length``).

    The normalisation reference set is the datamodule's ``reference_dataloader()`` when it has one
    (batches with ``input_ids`` / ``attention_mask``, or preference batches), else its
    ``val_dataloader()`` with chosen and rejected sequences pooled.

    Args:
        model: Hub name or local directory: a causal LM (for example the SFT export; a fresh head
            is added) or a sequence-classification checkpoint with one label (its head is kept).
            Required; with ``--run_dir`` it defaults to the run's SFT export (``RUN_DIR/sft/model``).
        optimizer: AdamW and learning-rate schedule; by default annealed linearly to 0 over the run.
        normalize: After training, shift the reward so the reference set scores mean 0 (``bias``),
            also scale it to std 1 (``gain_bias``), or leave it (``none``); per member in an ensemble.
        ensemble: train M reward models in one run and export them as an ensemble directory
            (:class:`~rlhf_lit.stages.ensemble_training.EnsembleConfig`); ``members: 1`` (the default)
            is the single reward model.
        length_debias: ``method: odin`` trains a length head beside the reward (quality) head and
            exports the quality head alone (:mod:`rlhf_lit.stages.length_debias`); ``none`` (the
            default) is the plain reward model.
        stage_args: the loading, LoRA and export arguments of :class:`~rlhf_lit.stages.base.PretrainedStage`
            (``tokenizer``, ``missing_pad``, ``dtype``, ``export_dir``, ``export_existing``,
            ``max_skipped_updates``, ``revision``, ``trust_remote_code``, ``lora``,
            ``gradient_checkpointing``).
            ``lora.export`` must be ``merged``: the normalisation is folded into base weights (a final
            LayerNorm's bias), which an adapter alone would not carry.
    """

    run_layout = RunLayout(
        "reward_model", inputs={"model": "sft"}
    )  # --run_dir: RUN_DIR/reward_model/, model from RUN_DIR/sft/model
    EXPORT_WHAT = "reward model"

    def __init__(
        self,
        model: str | None = None,
        optimizer: OptimizerConfig = OptimizerConfig(lr=1e-5, schedule="linear", min_lr_ratio=0.0),
        normalize: Normalize = "bias",
        ensemble: EnsembleConfig = EnsembleConfig(),
        length_debias: LengthDebiasConfig = LengthDebiasConfig(),
        **stage_args: Any,
    ) -> None:
        super().__init__(**stage_args)
        model = require_input(model, "model", "the model to start from (e.g. the SFT export)")
        if normalize not in ("none", "bias", "gain_bias"):
            raise ValueError(f"normalize must be none, bias or gain_bias; got {normalize!r}")
        if self.lora_config is not None and self.lora_config.export != "merged":
            raise ValueError(
                "lora.export: the reward model exports merged weights only (its normalisation is folded into "
                "base weights an adapter would not carry); set lora.export: merged"
            )
        self.optimizer_config = as_config(OptimizerConfig, optimizer)
        self.ensemble: EnsembleConfig = as_config(EnsembleConfig, ensemble)
        self.length_debias: LengthDebiasConfig = as_config(LengthDebiasConfig, length_debias)
        debias.refuse_unsupported(self.length_debias, self.ensemble.members, self.lora_config is not None)
        self.keep_settings(optimizer=self.optimizer_config, ensemble=self.ensemble, length_debias=self.length_debias)
        self.normalization: Normalize = normalize
        self.reference_name = "none"
        self.tokenizer = self.load_tokenizer(model, "right")  # preference batches are right padded (docs/CONTRACTS.md)
        new_head = not has_trained_score_head(model, self.revision, self.trust_remote_code)
        self.model = load_reward_model(model, self.tokenizer, **self.loading_args(), new_head=new_head)
        if new_head:
            # Hugging Face initialised the missing head N(0, 0.02); use the RM init instead.
            init_reward_head(score_head(self.model))
        if self.length_debias.enabled:  # a length head beside the quality head, dropped at export
            debias.add_length_head(self.model)
        if self.ensemble.members > 1:  # M members, each head from its seed (stages/ensemble_training.py)
            adapt = functools.partial(self.adapted, kind="reward")  # LoRA and checkpointing, per member
            self.model = ensemble_training.build_ensemble(self.model, new_head, self.ensemble, adapt)
            self.val_ensemble = ensemble_training.ValidationMetrics(self.ensemble.members)
        else:
            self.model = self.adapted(self.model, "reward")  # after the head init: the head trains in full
        # The normalised reward is gain * raw + bias (one per member); buffers, so checkpoints carry them.
        shape = (self.ensemble.members,) if self.ensemble.members > 1 else ()
        self.register_buffer("reward_gain", torch.ones(shape))
        self.register_buffer("reward_bias", torch.zeros(shape))
        self.val_loss = MeanMetric()
        self.val_accuracy = MeanMetric()
        self.val_margin = MeanMetric()
        self.val_ranking_exact = MeanMetric()  # ranking batches only
        self.val_kendall_tau = MeanMetric()  # ranking batches only
        self.val_length_correlation = PearsonCorrCoef()  # score vs response tokens, batches with prompt_length

    # ----- scoring -----------------------------------------------------------------------------

    def raw_scores(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The head read at the last real token, before normalisation, ``(B,)`` (an ensemble: ``(B, M)``;
        with a length head, the quality head's)."""
        if isinstance(self.model, RewardEnsemble):
            return self.model.raw_scores(input_ids, attention_mask)  # (B, M)
        scores = sequence_scores(self.model, input_ids, attention_mask)  # (B,), or both heads' (B, 2)
        return scores[:, debias.QUALITY] if scores.dim() == 2 else scores  # (B,)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The normalised reward ``gain * raw + bias``, ``(B,)`` (an ensemble: ``(B, M)``, per member)."""
        return self.reward_gain * self.raw_scores(input_ids, attention_mask) + self.reward_bias  # (B,)

    def batch_sequences(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Every sequence of a preference batch as one ``(N, T)`` batch: the chosen rows then the
        rejected rows (``N = 2B``), so each response goes through the model once, in one forward.
        A ranking batch is already one: its ``input_ids`` and ``attention_mask`` as they are."""
        if is_ranking_batch(batch):
            return batch["input_ids"], batch["attention_mask"]  # (N, T) x2
        # Padding values never matter: scores are read through the attention mask.
        return concat_pairs(
            batch["chosen_input_ids"],
            batch["chosen_attention_mask"],
            batch["rejected_input_ids"],
            batch["rejected_attention_mask"],
            self.tokenizer.pad_token_id,
        )  # (2B, T) x2

    def preference_loss(
        self, scores: torch.Tensor, batch: dict[str, torch.Tensor], weight: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loss, pair accuracy)`` of the scores of :meth:`batch_sequences`' rows, ``(N,)``.

        ``weight`` weighs the batch's examples (an ensemble member's bootstrap counts): ``(B,)`` one per
        prompt of a ranking batch, one per pair of a pair batch; None is the plain mean.
        """
        if is_ranking_batch(batch):
            return ranking_loss(scores, batch["group"], batch["rank"], batch["responses_per_prompt"], weight)
        B = batch["chosen_input_ids"].shape[0]
        if weight is None:
            return pairwise_reward_loss(scores[:B], scores[B:], batch.get("margin"))  # (), ()
        return pairwise_reward_loss(scores[:B], scores[B:], batch.get("margin"), weight)  # (), ()

    def pair_scores(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw scores of the chosen and rejected sequences from ONE forward pass, each ``(B,)``."""
        scores = self.raw_scores(*self.batch_sequences(batch))  # (2B,)
        B = batch["chosen_input_ids"].shape[0]
        return scores[:B], scores[B:]  # (B,), (B,)

    # ----- training and validation ---------------------------------------------------------------

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """Bradley-Terry loss on the raw scores (the bias cancels; the gain is 1 while training)."""
        with train_mode(self.model):  # what activates gradient checkpointing (dropout is off)
            if self.length_debias.enabled:
                return self._train_both_heads(sequence_scores(self.model, *self.batch_sequences(batch)), batch)
            scores = self.raw_scores(*self.batch_sequences(batch))  # (N,) or, an ensemble, (N, M)
        if isinstance(self.model, RewardEnsemble):
            return ensemble_training.training_step(self, scores, batch, batch_idx)
        loss, accuracy = self.preference_loss(scores, batch)  # (), ()
        B = batch_examples(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=B)
        self.log("train/accuracy", accuracy, batch_size=B)
        self.log("lr", self.optimizers().param_groups[0]["lr"], batch_size=B)
        return loss

    def _train_both_heads(self, heads: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The quality and length heads' scores ``(N, 2)`` -> ODIN's loss
        (:func:`~rlhf_lit.stages.length_debias.odin_loss`), logged with its parts."""
        loss, stats = debias.odin_loss(self, heads, batch)
        B = batch_examples(batch)
        self.log("train/loss", loss.detach(), prog_bar=True, batch_size=B)
        for name, value in stats.items():
            self.log(f"train/{name}", value, batch_size=B)
        self.log("lr", self.optimizers().param_groups[0]["lr"], batch_size=B)
        return loss

    def _log_length_correlation(self, scores: torch.Tensor, batch: dict[str, torch.Tensor]) -> None:
        """Pool the normalised scores ``(N,)`` of :meth:`batch_sequences`' rows with their response
        lengths into ``val/length_correlation`` (batches without ``prompt_length`` are left out)."""
        if "prompt_length" not in batch:
            return
        lengths = debias.response_lengths(batch).to(scores.device)  # (N,)
        self.val_length_correlation.update(scores.float(), lengths.float())
        self.log("val/length_correlation", self.val_length_correlation, batch_size=batch_examples(batch))

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        """Pair-weighted loss, accuracy and margin of the normalised scores (a ranking batch: also the
        ranking metrics; an ensemble: :class:`~rlhf_lit.stages.ensemble_training.ValidationMetrics`)."""
        if isinstance(self.model, RewardEnsemble):
            return self.val_ensemble.step(self, batch)
        if is_ranking_batch(batch):
            self._validate_rankings(batch)
            return
        chosen, rejected = self.pair_scores(batch)  # (B,), (B,)
        chosen = self.reward_gain * chosen + self.reward_bias  # (B,)
        rejected = self.reward_gain * rejected + self.reward_bias  # (B,)
        loss, _ = pairwise_reward_loss(chosen, rejected, batch.get("margin"))  # ()
        B = chosen.shape[0]
        self.val_loss.update(loss, weight=B)
        self.val_accuracy.update((chosen > rejected).float())  # (B,) per-pair wins
        self.val_margin.update(chosen - rejected)  # (B,)
        self.log("val/loss", self.val_loss, prog_bar=True, batch_size=B)
        self.log("val/accuracy", self.val_accuracy, prog_bar=True, batch_size=B)
        self.log("val/margin", self.val_margin, batch_size=B)
        self._log_length_correlation(torch.cat([chosen, rejected]), batch)

    def _validate_rankings(self, batch: dict[str, torch.Tensor]) -> None:
        """A ranking batch's loss (weighted by its prompts), accuracy and margin (by its pairs) and
        ranking metrics (by its prompts), of the normalised scores, pooled over the validation run."""
        scores = self.reward_gain * self.raw_scores(*self.batch_sequences(batch)) + self.reward_bias  # (N,)
        group, rank, per_prompt = batch["group"], batch["rank"], batch["responses_per_prompt"]
        loss, _ = ranking_loss(scores, group, rank, per_prompt)  # ()
        prompts = self.log_ranking_metrics(scores, batch)  # (B,) prompts with a pair weigh 1
        pairs = ranking_pair_mask(group, rank).to(scores.dtype)  # (N, N) pairs weigh 1
        diff = scores[:, None] - scores[None, :]  # (N, N) better - worse at [better, worse]
        self.val_loss.update(loss, weight=prompts.sum())
        self.val_accuracy.update((diff > 0).to(scores.dtype), weight=pairs)  # pooled over pairs
        self.val_margin.update(torch.where(pairs > 0, diff, 0), weight=pairs)
        B = batch_examples(batch)
        self.log("val/loss", self.val_loss, prog_bar=True, batch_size=B)
        self.log("val/accuracy", self.val_accuracy, prog_bar=True, batch_size=B)
        self.log("val/margin", self.val_margin, batch_size=B)
        self._log_length_correlation(scores, batch)

    def log_ranking_metrics(self, scores: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Update and log ``val/ranking_exact`` and ``val/kendall_tau`` of a ranking batch's ``scores``
        ``(N,)`` (a single RM's, or an ensemble's mean), pooled over the prompts that hold a pair;
        returns those prompts' weights ``(B,)``."""
        ranking = ranking_metrics(scores, batch["group"], batch["rank"], batch["responses_per_prompt"])  # (B,) x3
        prompts = ranking.has_pairs.to(scores.dtype)  # (B,)
        self.val_ranking_exact.update(ranking.exact, weight=prompts)
        self.val_kendall_tau.update(ranking.kendall_tau, weight=prompts)
        B = batch_examples(batch)
        self.log("val/ranking_exact", self.val_ranking_exact, batch_size=B)
        self.log("val/kendall_tau", self.val_kendall_tau, batch_size=B)
        return prompts

    def configure_model(self) -> None:
        """Shard the model under FSDP; an ensemble is refused there (one clear line, before any step)."""
        if isinstance(self.model, RewardEnsemble):
            ensemble_training.refuse_sharding(self)
        debias.refuse_sharding(self)
        super().configure_model()

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """``trainer.gradient_clip_val``; an ensemble clips each member on its own (as M single runs would)."""
        if isinstance(self.model, RewardEnsemble):
            return ensemble_training.clip_each_member(self.model, gradient_clip_val, gradient_clip_algorithm)
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    # ----- normalisation and export --------------------------------------------------------------

    def _reference_source(self) -> tuple[Iterable[dict[str, torch.Tensor]], str]:
        """The reference batches and their description; raises when the datamodule offers none."""
        dm = self.trainer.datamodule
        if dm is not None and callable(getattr(dm, "reference_dataloader", None)):
            return dm.reference_dataloader(), f"{type(dm).__name__}.reference_dataloader()"
        if dm is not None and is_overridden("val_dataloader", dm):
            responses = "every ranked response" if getattr(dm, "format", None) == "rankings" else "chosen + rejected"
            return dm.val_dataloader(), f"{type(dm).__name__}.val_dataloader() {responses}"
        raise ValueError(
            f"normalize={self.normalization!r} needs reference data: fit with a datamodule that has "
            "reference_dataloader() or val_dataloader(), or set normalize='none'"
        )

    def check_before_fit(self) -> None:
        """Fail before training, not after it, when normalisation will have no reference data.

        The datamodule is set up by now, so an empty reference loader (e.g. a ``val_dataloader()``
        that returns ``[]`` for "no validation") is caught here.
        """
        if self.normalization == "none":
            return
        batches, reference = self._reference_source()
        if hasattr(batches, "__len__") and len(batches) == 0:
            raise ValueError(
                f"normalize={self.normalization!r}: the reference data {reference} is empty; give the "
                "datamodule validation or reference data, or set normalize='none'"
            )

    @torch.no_grad()
    def normalize(
        self,
        reference_batches: Iterable[dict[str, torch.Tensor]],
        reference: str = "custom",
        kind: Normalize | None = None,
    ) -> tuple[float, float]:
        """Set ``reward_gain`` / ``reward_bias`` so the reference sequences score mean 0 (and std 1).

        Scores every sequence of ``reference_batches`` (``input_ids`` / ``attention_mask`` batches, such
        as ranking batches, whose responses are pooled, or pair batches, whose chosen and rejected
        sequences are pooled) with the raw model. Under a
        distributed trainer the moments are summed over processes, so sharded and replicated loaders
        both give the pooled statistics. The std is the population std. One host sync at the end.

        Args:
            reference_batches: Iterable of batches (e.g. a DataLoader).
            reference: Description recorded in the exported config.
            kind: ``bias`` or ``gain_bias`` (``none`` resets to gain 1, bias 0); None means the
                module's ``normalize`` setting.

        Returns:
            ``(gain, bias)`` as floats (also stored in the buffers); an ensemble: lists, one per member.
        """
        if isinstance(self.model, RewardEnsemble):
            return ensemble_training.normalize(self, reference_batches, reference, kind or self.normalization)
        moments = torch.zeros(3, dtype=torch.float64, device=self.device)  # count, sum, sum of squares
        for batch in reference_batches:
            batch = {k: v.to(self.device) for k, v in batch.items() if isinstance(v, torch.Tensor)}
            if "chosen_input_ids" in batch:
                scores = self.raw_scores(*self.batch_sequences(batch))  # (2B,)
            else:
                scores = self.raw_scores(batch["input_ids"], batch["attention_mask"])  # (B,)
            scores = scores.double()  # (N,)
            count = torch.tensor(float(scores.numel()), dtype=torch.float64, device=self.device)  # ()
            moments += torch.stack([count, scores.sum(), (scores**2).sum()])  # (3,)
        if self._trainer is not None:
            moments = self.trainer.strategy.reduce(moments, reduce_op="sum")
        count, total, total_sq = moments.tolist()
        if count == 0:
            raise ValueError(f"reference set {reference!r} is empty; cannot normalise the reward")
        mean = total / count
        std = max(total_sq / count - mean**2, 0.0) ** 0.5
        gain, bias = gain_and_bias(mean, std, kind or self.normalization)
        self.reward_gain.fill_(gain)
        self.reward_bias.fill_(bias)
        self.reference_name = reference
        log.info(
            "reward normalisation from %s (%d sequences): raw mean %.6g std %.6g -> gain %.6g bias %.6g",
            reference,
            int(count),
            mean,
            std,
            gain,
            bias,
        )
        return gain, bias

    def on_train_end(self) -> None:
        """Normalise with the final weights, while the model is still on its device and processes are up;
        then free the optimizer states (:meth:`~rlhf_lit.stages.base.StageModule.release_after_fit`)."""
        if self.normalization != "none":
            batches, reference = self._reference_source()
            self.normalize(batches, reference)
        super().on_train_end()

    def on_fit_end(self) -> None:
        """Fold the normalisation into the weights (every rank) and export the model (rank 0)."""
        if isinstance(self.model, RewardEnsemble):  # per member; exported as an ensemble directory
            ensemble_training.fold(self)
            return super().on_fit_end()
        debias.drop_length_head(self.model)  # the export carries the quality head alone
        gain, bias = float(self.reward_gain), float(self.reward_bias)
        reshard(self.model)  # under FSDP the fold must change the shards, not a gathered copy
        folded = fold_normalization(self.model, gain, bias)
        record_normalization(self.model.config, gain, bias, self.reference_name, folded)
        # The weights now carry the gain (and the bias when folded); the buffers keep the rest, so
        # forward() still returns the normalised reward.
        self.reward_gain.fill_(1.0)
        self.reward_bias.fill_(0.0 if folded else bias)
        super().on_fit_end()

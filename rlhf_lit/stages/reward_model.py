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

The variant (one reward model, an ensemble, ODIN's length head) is a reward head
(:mod:`rlhf_lit.stages.reward_heads`), chosen once from the ``ensemble`` and ``length_debias``
settings: its scores, loss, validation metrics, clipping and export. This module keeps what every
variant shares (loading, the normalisation and its fold, the export) and never asks which head it holds.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from typing import Any

import torch
from lightning.pytorch.utilities.model_helpers import is_overridden

from rlhf_lit.artifacts import CHAT_RENDERED_KEY, REWARD_MODEL_EXPORT
from rlhf_lit.functional import batch_examples, batch_sequences
from rlhf_lit.models import init_reward_head, load_reward_model, score_head
from rlhf_lit.models.loading import has_score_head
from rlhf_lit.models.memory import train_mode
from rlhf_lit.models.reward_norm import Normalize, fold_normalization, gain_and_bias, record_normalization
from rlhf_lit.models.sharding import reshard
from rlhf_lit.stages.base import RunLayout, as_config, require_input
from rlhf_lit.stages.optim import OptimizerConfig
from rlhf_lit.stages.pretrained import PretrainedStage
from rlhf_lit.stages.reward_heads import head
from rlhf_lit.stages.reward_heads.ensemble_head import EnsembleConfig
from rlhf_lit.stages.reward_heads.odin_head import LengthDebiasConfig
from rlhf_lit.stages.reward_heads.registry import build_head

log = logging.getLogger(__name__)


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
            (:class:`~rlhf_lit.stages.reward_heads.ensemble_head.EnsembleConfig`); ``members: 1``
            (the default) is the single reward model.
        length_debias: ``method: odin`` trains a length head beside the reward (quality) head and
            exports the quality head alone (:mod:`rlhf_lit.stages.reward_heads.odin_head`); ``none``
            (the default) is the plain reward model.
        stage_args: the loading, LoRA and export arguments of :class:`~rlhf_lit.stages.base.PretrainedStage`
            (``tokenizer``, ``missing_pad``, ``dtype``, ``export_dir``, ``export_existing``,
            ``max_skipped_updates``, ``revision``, ``trust_remote_code``, ``attn_implementation``, ``lora``,
            ``gradient_checkpointing``).
            ``lora.export`` must be ``merged``: the normalisation is folded into base weights (a final
            LayerNorm's bias), which an adapter alone would not carry.
    """

    run_layout = RunLayout(
        "reward_model", inputs={"model": "sft"}
    )  # --run_dir: RUN_DIR/reward_model/, model from RUN_DIR/sft/model
    EXPORT_WHAT = REWARD_MODEL_EXPORT  # what a judge given as a directory must be (rlhf_lit.evaluation.reward_judge)

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
        self.head = build_head(self.ensemble, self.length_debias, lora=self.lora_config is not None)
        self.keep_settings(optimizer=self.optimizer_config, ensemble=self.ensemble, length_debias=self.length_debias)
        self.normalization: Normalize = normalize
        self.reference_name = "none"
        self.tokenizer = self.load_tokenizer(model, "right")  # preference batches are right padded (docs/CONTRACTS.md)
        new_head = not has_score_head(model, "model", self.loading)
        start = load_reward_model(model, self.tokenizer, self.loading, new_head=new_head)
        if new_head:
            # Hugging Face initialised the missing head N(0, 0.02); use the RM init instead.
            init_reward_head(score_head(start))
        self.model = self.head.build(start, new_head, functools.partial(self.adapted, kind="reward"))
        # The normalised reward is gain * raw + bias (one per score column); buffers, so checkpoints carry them.
        self.register_buffer("reward_gain", torch.ones(self.head.normalization_shape))
        self.register_buffer("reward_bias", torch.zeros(self.head.normalization_shape))

    # ----- scoring -----------------------------------------------------------------------------

    def raw_scores(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The head's scores at the last real token, before normalisation, ``(B,)`` (an ensemble: ``(B, M)``;
        with a length head, the quality head's)."""
        return self.head.scores(self.model, input_ids, attention_mask)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The normalised reward ``gain * raw + bias``, ``(B,)`` (an ensemble: ``(B, M)``, per member)."""
        return self.reward_gain * self.raw_scores(input_ids, attention_mask) + self.reward_bias  # (B,)

    def batch_sequences(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Every sequence of a batch as one ``(N, T)`` batch
        (:func:`~rlhf_lit.functional.batch_sequences`: pairs' chosen rows then their
        rejected rows, a ranking batch's or a reference batch's rows as they are)."""
        return batch_sequences(batch, self.tokenizer.pad_token_id)

    def trunk_rows(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows the reward model scores (``cache_frozen``'s prefill): :meth:`batch_sequences`."""
        return self.batch_sequences(batch)

    def pair_scores(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw scores of the chosen and rejected sequences from ONE forward pass, each ``(B,)``."""
        return self.raw_scores(*self.batch_sequences(batch)).chunk(2)  # (2B,): chosen rows, then rejected rows

    # ----- training and validation ---------------------------------------------------------------

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """The head's loss on the raw scores (the bias cancels; the gain is 1 while training), logged
        with its statistics as ``train/<name>``."""
        step = head.TrainingStep(self.current_epoch, batch_idx, self.global_rank)
        with train_mode(self.model):  # what activates gradient checkpointing (dropout is off)
            loss, stats = self.head.loss(self.model, self.batch_sequences(batch), batch, step)
        B = batch_examples(batch)
        for name, value in stats.items():
            self.log(f"train/{name}", value, prog_bar=name == "loss", batch_size=B)
        self.log("lr", self.optimizers().param_groups[0]["lr"], batch_size=B)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        """The head's validation metrics of the normalised scores (what the exported model gives)."""
        self.head.validate(self(*self.batch_sequences(batch)), batch, self.log)

    def configure_model(self) -> None:
        """Shard the model under FSDP; a head that cannot be sharded is refused (one line, before any step)."""
        if getattr(self, "_device_mesh", None) is not None and self.head.fsdp_refusal:
            raise ValueError(self.head.fsdp_refusal)
        super().configure_model()

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """``trainer.gradient_clip_val`` as the head clips (an ensemble: each member on its own)."""
        clip_whole = functools.partial(
            super().configure_gradient_clipping, optimizer, gradient_clip_val, gradient_clip_algorithm
        )
        self.head.clip_gradients(self.model, gradient_clip_val, gradient_clip_algorithm, clip_whole)

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
    ) -> tuple[float | list[float], float | list[float]]:
        """Set ``reward_gain`` / ``reward_bias`` so the reference sequences score mean 0 (and std 1),
        each score column (ensemble member) on its own.

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
        columns = self.reward_gain.numel()  # 1, or M members
        moments = torch.zeros(3, columns, dtype=torch.float64, device=self.device)  # count, sum, sum of squares
        for batch in reference_batches:
            batch = {k: v.to(self.device) for k, v in batch.items() if isinstance(v, torch.Tensor)}
            scores = self.raw_scores(*self.batch_sequences(batch)).double().reshape(-1, columns)  # (N, columns)
            moments += torch.stack([scores**0, scores, scores**2]).sum(dim=1)  # (3, columns)
        if self._trainer is not None:
            moments = self.trainer.strategy.reduce(moments, reduce_op="sum")
        counts, totals, squares = moments.tolist()
        if counts[0] == 0:
            raise ValueError(f"reference set {reference!r} is empty; cannot normalise the reward")
        means = [total / count for total, count in zip(totals, counts)]
        stds = [max(square / count - mean**2, 0.0) ** 0.5 for square, count, mean in zip(squares, counts, means)]
        gains, biases = zip(*(gain_and_bias(mean, std, kind or self.normalization) for mean, std in zip(means, stds)))
        # float64 and of the buffers' shape: what is returned is exact, a float for one score column
        gain, bias = (torch.tensor(x, dtype=torch.float64).reshape(self.reward_gain.shape) for x in (gains, biases))
        self.reward_gain.copy_(gain)
        self.reward_bias.copy_(bias)
        self.reference_name = reference
        summary = "; ".join(
            f"raw mean {m:.6g} std {s:.6g} -> gain {g:.6g} bias {b:.6g}"
            for m, s, g, b in zip(means, stds, gains, biases)
        )
        log.info("reward normalisation from %s (%d sequences): %s", reference, int(counts[0]), summary)
        return gain.tolist(), bias.tolist()

    def on_train_end(self) -> None:
        """Normalise with the final weights, while the model is still on its device and processes are up;
        then free the optimizer states (:meth:`~rlhf_lit.stages.base.StageModule.release_after_fit`)."""
        if self.normalization != "none":
            batches, reference = self._reference_source()
            self.normalize(batches, reference)
        super().on_train_end()

    def export_facts(self) -> dict[str, Any]:
        """Whether the reward model was trained on prompts rendered with its chat template (the data module's
        ``chat_rendered``, :data:`~rlhf_lit.artifacts.CHAT_RENDERED_KEY`): how it reads prompts as a judge."""
        rendered = getattr(getattr(self.trainer, "datamodule", None), "chat_rendered", None)
        return {} if rendered is None else {CHAT_RENDERED_KEY: bool(rendered)}

    def on_fit_end(self) -> None:
        """Fold each score column's normalisation into its reward model (every rank) and export (rank 0)."""
        models = self.head.ready_for_export(self.model)  # e.g. without a length head, or the members
        kept = []
        for model, gain, bias in zip(models, self.reward_gain.flatten().tolist(), self.reward_bias.flatten().tolist()):
            reshard(model)  # under FSDP the fold must change the shards, not a gathered copy
            folded = fold_normalization(model, gain, bias)
            record_normalization(model.config, gain, bias, self.reference_name, folded)
            kept.append(0.0 if folded else bias)
        # The weights now carry the gain (and the bias when folded); the buffers keep the rest, so
        # forward() still returns the normalised reward.
        self.reward_gain.fill_(1.0)
        self.reward_bias.copy_(torch.tensor(kept).reshape(self.reward_bias.shape))
        super().on_fit_end()

"""Supervised fine-tuning (SFT): next-token cross-entropy on demonstration responses only.

Stage 1 of InstructGPT. Batches follow docs/CONTRACTS.md (SFT, right padded): ``input_ids``,
``attention_mask`` and ``labels`` with -100 on prompt and pad positions, so the prompt is read
but never trained on. At the end of fit the model and tokenizer are exported in Hugging Face
format (``AutoModelForCausalLM.from_pretrained(export_dir)``) for the reward-model and PPO stages.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import lightning.pytorch as pl
import torch
from torchmetrics import MeanMetric

from rlhf_lit.functional import sft_loss
from rlhf_lit.models import load_causal_lm, position_ids_from_mask
from rlhf_lit.models.loading import DType
from rlhf_lit.models.lora import LoRAConfig, exportable, with_lora
from rlhf_lit.models.memory import enable_gradient_checkpointing, train_mode
from rlhf_lit.models.sharding import shard_models
from rlhf_lit.stages.base import RunLayout
from rlhf_lit.stages.guarded import GuardedStage
from rlhf_lit.stages.nonfinite import NonFiniteGuard
from rlhf_lit.stages.export import ExportExisting, check_export_at_fit_start, export_at_fit_end
from rlhf_lit.stages.dataclass_args import as_config
from rlhf_lit.stages.optim import OptimizerConfig, lightning_optimizers
from rlhf_lit.stages.precision import warn_if_slow_precision
from rlhf_lit.tokenizer import MissingPad, load_tokenizer

IGNORE_INDEX = -100


class SFTModule(GuardedStage, pl.LightningModule):
    """Fine-tunes any ``AutoModelForCausalLM`` on (prompt, response) demonstrations.

    Logs ``train/loss``, ``train/ppl`` and ``lr`` every step, and the token-weighted ``val/loss``
    (total NLL of all validation response tokens / their number, not a mean of batch means) and
    ``val/ppl = exp(val/loss)`` every validation run.

    Args:
        model: Hugging Face hub name or local directory of a causal LM.
        tokenizer: Hub name or directory of the tokenizer; None uses ``model``'s.
        missing_pad: What to do when the tokenizer has no pad token (``add`` a new one, reuse
            ``eos`` / ``unk``, or ``error``); embeddings grow when a token is added.
        dtype: Weight dtype. Keep ``float32`` together with ``precision="bf16-mixed"``.
        optimizer: AdamW and learning-rate schedule, over ``trainer.estimated_stepping_batches`` steps.
        export_dir: Where the final model and tokenizer are written at the end of fit; None means
            ``<log dir or default_root_dir>/model``.
        export_existing: when ``export_dir`` already holds an earlier rlhf-lit export: ``refuse``
            (stop before training) or ``replace`` it (atomically, at the end of fit). A non-empty
            directory rlhf-lit did not write is never replaced.
        max_skipped_updates: stop after this many optimizer steps in a row were skipped for NaN or
            inf gradients (a NaN loss gives NaN gradients); see :mod:`rlhf_lit.stages.nonfinite`.
        revision: Hub revision of ``model`` (and of the tokenizer when ``tokenizer`` is None).
        trust_remote_code: Allow model code from the hub.
        lora: LoRA adapters (:class:`~rlhf_lit.models.lora.LoRAConfig`); only they train.
            ``lora.export`` chooses merged full weights or the adapter alone for the export.
        gradient_checkpointing: recompute each transformer block's activations in the backward
            pass instead of storing them (less activation memory, about one more forward pass).
    """

    run_layout = RunLayout("sft")  # --run_dir: RUN_DIR/sft/ (rlhf_lit.runs)

    def __init__(
        self,
        model: str,
        tokenizer: str | None = None,
        missing_pad: MissingPad = "add",
        dtype: DType = "float32",
        optimizer: OptimizerConfig = OptimizerConfig(),
        export_dir: str | None = None,
        export_existing: ExportExisting = "refuse",
        max_skipped_updates: int = 3,
        revision: str | None = None,
        trust_remote_code: bool = False,
        lora: LoRAConfig | None = None,
        gradient_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        # load_from_checkpoint passes the optimizer back as the dict saved below.
        self.optimizer_config = as_config(OptimizerConfig, optimizer)
        # A dataclass in hparams breaks weights_only checkpoint loading: store its dict instead.
        self.lora_config = None if lora is None else as_config(LoRAConfig, lora)
        self.save_hyperparameters(ignore=["optimizer", "lora"])
        self.hparams["optimizer"] = asdict(self.optimizer_config)
        self.hparams["lora"] = None if self.lora_config is None else asdict(self.lora_config)
        self.export_dir, self.export_existing = export_dir, export_existing
        self.nonfinite = NonFiniteGuard(max_skipped_updates, "max_skipped_updates")
        self.exported_path: Path | None = None
        self.tokenizer = load_tokenizer(
            tokenizer or model,
            padding_side="right",  # SFT batches are right padded (docs/CONTRACTS.md)
            missing_pad=missing_pad,
            revision=revision if tokenizer is None else None,
            trust_remote_code=trust_remote_code,
            what="tokenizer" if tokenizer else "model",
        )
        self.model = load_causal_lm(
            model, self.tokenizer, dtype=dtype, revision=revision, trust_remote_code=trust_remote_code
        )
        self.model = with_lora(self.model, self.lora_config, "causal_lm")
        if gradient_checkpointing:
            enable_gradient_checkpointing(self.model)
        # Weighted by token count, so the epoch value is total NLL / total response tokens.
        self.val_nll = MeanMetric()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Causal-LM logits ``(B, T, V)``; positions count real tokens only."""
        return self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
            use_cache=False,
        ).logits  # (B, T, V)

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean next-token NLL over the response tokens of ``batch`` (labels != -100), ``()``."""
        logits = self(batch["input_ids"], batch["attention_mask"])  # (B, T, V)
        return sft_loss(logits, batch["labels"], ignore_index=IGNORE_INDEX)  # ()

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """Response-only cross-entropy; logs loss, perplexity and the learning rate."""
        with train_mode(self.model):  # what activates gradient checkpointing (dropout is off)
            loss = self.loss(batch)  # ()
        batch_size = batch["input_ids"].shape[0]
        self.log("train/loss", loss, prog_bar=True, batch_size=batch_size)
        self.log("train/ppl", loss.detach().exp(), batch_size=batch_size)
        self.log("lr", self.optimizers().param_groups[0]["lr"], batch_size=batch_size)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        """Accumulate this batch's mean NLL weighted by its number of counted response tokens."""
        loss = self.loss(batch)  # ()
        n_tokens = (batch["labels"][:, 1:] != IGNORE_INDEX).sum()  # () the labels sft_loss counted
        self.val_nll.update(loss, weight=n_tokens)

    def on_validation_epoch_end(self) -> None:
        """Log the token-weighted loss of the whole validation set and its perplexity."""
        loss = self.val_nll.compute()  # () synced across processes by torchmetrics
        self.log("val/loss", loss, prog_bar=True)
        self.log("val/ppl", loss.exp())
        self.val_nll.reset()

    def configure_model(self) -> None:
        """Shard the model under FSDP (``fsdp`` / ``fsdp2``, :mod:`rlhf_lit.strategies`); no-op otherwise."""
        shard_models(self, {"model": self.model})

    def configure_optimizers(self) -> dict:
        """AdamW with warmup and decay over the whole run (see :class:`OptimizerConfig`)."""
        return lightning_optimizers(self.model, self.optimizer_config, self.trainer.estimated_stepping_batches)

    def on_fit_start(self) -> None:
        """Refuse an export target the end of fit could not write, before any training step."""
        check_export_at_fit_start(self.trainer, self.export_dir, self.export_existing)
        warn_if_slow_precision(self.trainer)

    def on_fit_end(self) -> None:
        """Export the fine-tuned model and tokenizer in Hugging Face format (rank 0)."""
        self.exported_path = export_at_fit_end(
            self.trainer, exportable(self.model), self.tokenizer, self.export_dir, "SFT model", self.export_existing
        )

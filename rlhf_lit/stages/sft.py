"""Supervised fine-tuning (SFT): next-token cross-entropy on demonstration responses only.

Stage 1 of InstructGPT. Batches follow docs/CONTRACTS.md (SFT, right padded): ``input_ids``,
``attention_mask`` and ``labels`` with -100 on prompt and pad positions, so the prompt is read
but never trained on. At the end of fit the model and tokenizer are exported in Hugging Face
format (``AutoModelForCausalLM.from_pretrained(export_dir)``) for the reward-model and PPO stages.
"""

from __future__ import annotations

from typing import Any

import torch
from torchmetrics import MeanMetric

from rlhf_lit.functional import IGNORE_INDEX, sft_loss
from rlhf_lit.models import load_causal_lm
from rlhf_lit.models.memory import train_mode
from rlhf_lit.models.scoring import causal_lm_logits
from rlhf_lit.stages.base import RunLayout, as_config
from rlhf_lit.stages.optim import OptimizerConfig
from rlhf_lit.stages.pretrained import PretrainedStage


class SFTModule(PretrainedStage):
    """Fine-tunes any ``AutoModelForCausalLM`` on (prompt, response) demonstrations.

    Logs ``train/loss``, ``train/ppl`` and ``lr`` every step, and the token-weighted ``val/loss``
    (total NLL of all validation response tokens / their number, not a mean of batch means) and
    ``val/ppl = exp(val/loss)`` every validation run.

    Args:
        model: Hugging Face hub name or local directory of a causal LM.
        optimizer: AdamW and learning-rate schedule, over ``trainer.estimated_stepping_batches`` steps.
        stage_args: the loading, LoRA and export arguments of :class:`~rlhf_lit.stages.base.PretrainedStage`
            (``tokenizer``, ``missing_pad``, ``dtype``, ``export_dir``, ``export_existing``,
            ``max_skipped_updates``, ``revision``, ``trust_remote_code``, ``attn_implementation``, ``lora``,
            ``gradient_checkpointing``).
    """

    run_layout = RunLayout("sft")  # --run_dir: RUN_DIR/sft/
    EXPORT_WHAT = "SFT model"

    def __init__(self, model: str, optimizer: OptimizerConfig = OptimizerConfig(), **stage_args: Any) -> None:
        super().__init__(**stage_args)
        self.optimizer_config = as_config(OptimizerConfig, optimizer)
        self.keep_settings(optimizer=self.optimizer_config)
        self.tokenizer = self.load_tokenizer(model, "right")  # SFT batches are right padded (docs/CONTRACTS.md)
        self.model = self.adapted(load_causal_lm(model, self.tokenizer, self.loading), "causal_lm")
        # Weighted by token count, so the epoch value is total NLL / total response tokens.
        self.val_nll = MeanMetric()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Causal-LM logits ``(B, T, V)``; positions count real tokens only."""
        return causal_lm_logits(self.model, input_ids, attention_mask)  # (B, T, V)

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean next-token NLL over the response tokens of ``batch`` (labels != IGNORE_INDEX), ``()``."""
        logits = self(batch["input_ids"], batch["attention_mask"])  # (B, T, V)
        return sft_loss(logits, batch["labels"], ignore_index=IGNORE_INDEX)  # ()

    def trunk_rows(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows the loss reads (``cache_frozen``'s prefill)."""
        return batch["input_ids"], batch["attention_mask"]

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

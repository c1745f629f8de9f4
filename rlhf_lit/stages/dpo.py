"""Direct preference optimisation (DPO): the policy trained on preference pairs against a frozen reference.

A fourth stage beside SFT, RM and PPO (Rafailov et al. 2023): no reward model, no sampling. It
reads the same preference batches as the reward model (``PreferenceDataModule``) and needs their
``prompt_length`` field to know where each response starts. Details followed:

- the reference is the SFT model, frozen (no gradients, eval mode, ``torch.no_grad``); with LoRA
  it is the policy with its adapters switched off, so no second copy is loaded
  (:func:`rlhf_lit.models.reference.build_reference`). It is never written into checkpoints and
  reloaded from ``model`` instead (house rule 7);
- sequence logprobs count the response tokens only (prompt and pads masked, positions from the
  attention mask, logits shifted by one), summed for DPO and averaged for IPO
  (:mod:`rlhf_lit.functional.dpo` explains why);
- chosen and rejected sequences go through each model in ONE forward pass (concatenated along
  the batch), the reference's once per batch, without gradients;
- dropout is off in both models (the loaders), so policy and reference agree exactly before the
  first update: the loss starts at log 2 for ``loss="sigmoid"``.

Departures: reference logprobs are computed per batch (not precomputed over the dataset), which
costs one no-grad forward pass per step and keeps the reference in memory.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F

from rlhf_lit.functional import (
    DPOLossKind,
    averages_over_tokens,
    check_dpo_settings,
    dpo_loss,
    response_mask_from_prompt_length,
)
from rlhf_lit.models import load_causal_lm, response_sequence_logprobs
from rlhf_lit.models.loading import DType
from rlhf_lit.models.lora import LoRAConfig, exportable, with_lora
from rlhf_lit.models.memory import enable_gradient_checkpointing, train_mode
from rlhf_lit.models.reference import build_reference
from rlhf_lit.models.sharding import reshard, shard_models
from rlhf_lit.stages.dataclass_args import as_config
from rlhf_lit.stages.export import ExportExisting, check_export_at_fit_start, export_at_fit_end
from rlhf_lit.stages.guarded import GuardedStage
from rlhf_lit.stages.nonfinite import NonFiniteGuard
from rlhf_lit.stages.optim import OptimizerConfig, lightning_optimizers
from rlhf_lit.stages.precision import warn_if_slow_precision
from rlhf_lit.stages.resume import check_loaded_keys
from rlhf_lit.tokenizer import MissingPad, load_tokenizer

METRICS = ("rewards_chosen", "rewards_rejected", "reward_accuracy", "reward_margin", "implicit_kl")
"""The statistics of :func:`rlhf_lit.functional.dpo_loss`, logged as ``train/<name>`` and ``val/<name>``."""


def _pad_right(x: torch.Tensor, length: int, value: int) -> torch.Tensor:
    """Right-pad ``(B, T)`` to ``(B, length)``."""
    return F.pad(x, (0, length - x.shape[1]), value=value)  # (B, length)


class DPOModule(GuardedStage, pl.LightningModule):
    """Trains a causal-LM policy on (chosen, rejected) pairs with a DPO-family loss and exports it.

    Logs ``train/loss``, ``lr`` and the implicit-reward statistics ``train/rewards_chosen``,
    ``train/rewards_rejected``, ``train/reward_accuracy``, ``train/reward_margin`` and
    ``train/implicit_kl`` every step (see :func:`rlhf_lit.functional.dpo_loss`); the same under
    ``val/`` (pair-weighted means over the validation set) when the data module has validation
    pairs. At the end of fit the policy and tokenizer are exported in Hugging Face format
    (``AutoModelForCausalLM.from_pretrained(export_dir)``).

    Args:
        model: Hub name or local directory of the causal LM to start from, usually the SFT export.
            It is also the reference (a frozen copy; with ``lora``, the policy's own base weights).
        tokenizer: Hub name or directory of the tokenizer; None uses ``model``'s.
        missing_pad: What to do when the tokenizer has no pad token (``add``, ``eos``, ``unk``, ``error``).
        dtype: Weight dtype of policy and reference. Keep ``float32`` together with ``precision="bf16-mixed"``.
        beta: > 0, the strength of the implicit KL penalty towards the reference (DPO's beta; IPO's tau).
            Smaller lets the policy move further; typical 0.01 to 0.5.
        loss: the loss (:data:`~rlhf_lit.functional.dpo.DPOLossKind`): ``sigmoid`` (DPO; with
            ``label_smoothing`` conservative DPO) or ``ipo`` (token-averaged logprobs).
        label_smoothing: in [0, 0.5): the assumed probability that a preference label is flipped
            (conservative DPO); ``sigmoid`` only.
        optimizer: AdamW and learning-rate schedule; by default annealed linearly to 0 over the run.
        export_dir: Where the final policy and tokenizer are written at the end of fit; None means
            ``<log dir or default_root_dir>/model``.
        export_existing: when ``export_dir`` already holds an earlier rlhf-lit export: ``refuse``
            (stop before training) or ``replace`` it (atomically, at the end of fit). A non-empty
            directory rlhf-lit did not write is never replaced.
        max_skipped_updates: stop after this many optimizer steps in a row were skipped for NaN or
            inf gradients; see :mod:`rlhf_lit.stages.nonfinite`.
        revision: Hub revision of ``model`` (and of the tokenizer when ``tokenizer`` is None).
        trust_remote_code: Allow model code from the hub.
        lora: LoRA adapters (:class:`~rlhf_lit.models.lora.LoRAConfig`); only they train, and the
            reference is the policy with the adapters disabled. ``lora.export`` chooses merged full
            weights or the adapter alone for the export.
        gradient_checkpointing: recompute each transformer block's activations of the policy in the
            backward pass instead of storing them.
    """

    FROZEN_PREFIXES = ("ref_model.",)
    """State-dict prefix of the frozen reference: never written to checkpoints, reloaded from ``model``."""

    def __init__(
        self,
        model: str,
        tokenizer: str | None = None,
        missing_pad: MissingPad = "add",
        dtype: DType = "float32",
        beta: float = 0.1,
        loss: DPOLossKind = "sigmoid",
        label_smoothing: float = 0.0,
        optimizer: OptimizerConfig = OptimizerConfig(lr=1e-6, schedule="linear", min_lr_ratio=0.0),
        export_dir: str | None = None,
        export_existing: ExportExisting = "refuse",
        max_skipped_updates: int = 3,
        revision: str | None = None,
        trust_remote_code: bool = False,
        lora: LoRAConfig | None = None,
        gradient_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        check_dpo_settings(beta, loss, label_smoothing)
        self.beta, self.loss_kind, self.label_smoothing = beta, loss, label_smoothing
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
            padding_side="right",  # preference batches are right padded (docs/CONTRACTS.md)
            missing_pad=missing_pad,
            revision=revision if tokenizer is None else None,
            trust_remote_code=trust_remote_code,
            what="tokenizer" if tokenizer else "model",
        )

        def load() -> torch.nn.Module:
            return load_causal_lm(model, self.tokenizer, dtype=dtype, revision=revision,
                                  trust_remote_code=trust_remote_code)  # fmt: skip

        self.model = with_lora(load(), self.lora_config, "causal_lm")

        def frozen_copy() -> torch.nn.Module:  # only without LoRA: see build_reference
            self.ref_model = load().requires_grad_(False).eval()
            return self.ref_model

        self.reference = build_reference(self.model, frozen_copy)
        if gradient_checkpointing:
            enable_gradient_checkpointing(self.model)

    @property
    def average_logprobs(self) -> bool:
        """Whether the loss reads token-averaged sequence logprobs (IPO) rather than sums (DPO)."""
        return averages_over_tokens(self.loss_kind)

    def train(self, mode: bool = True) -> DPOModule:
        """Set train / eval mode; the frozen reference copy stays in eval mode either way."""
        super().train(mode)
        ref_model = self._modules.get("ref_model")
        if ref_model is not None:
            ref_model.eval()
        return self

    # ----- logprobs --------------------------------------------------------------------------------

    def _pair_inputs(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Chosen then rejected rows as one ``(2B, T)`` batch: ids, attention mask and response mask."""
        if "prompt_length" not in batch:
            raise ValueError(
                "DPOModule needs preference batches with prompt_length (B,), the number of prompt tokens "
                "(rlhf_lit.data.PreferenceDataModule gives it; see docs/CONTRACTS.md)"
            )
        chosen_ids, rejected_ids = batch["chosen_input_ids"], batch["rejected_input_ids"]
        T = max(chosen_ids.shape[1], rejected_ids.shape[1])
        pad_id = self.tokenizer.pad_token_id
        input_ids = torch.cat([_pad_right(chosen_ids, T, pad_id), _pad_right(rejected_ids, T, pad_id)])  # (2B, T)
        attention_mask = torch.cat([_pad_right(batch["chosen_attention_mask"], T, 0),
                                    _pad_right(batch["rejected_attention_mask"], T, 0)])  # (2B, T)
        prompt_length = batch["prompt_length"].repeat(2)  # (2B,)
        response_mask = response_mask_from_prompt_length(attention_mask, prompt_length)  # (2B, T)
        return input_ids, attention_mask, response_mask

    def pair_logprobs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Sequence logprobs of chosen and rejected responses under the policy (with gradient when
        enabled) and the reference (never), each ``(B,)``: ``logps_chosen``, ``logps_rejected``,
        ``ref_logps_chosen``, ``ref_logps_rejected``. Sums or token means, as the loss needs."""
        input_ids, attention_mask, response_mask = self._pair_inputs(batch)
        B = batch["chosen_input_ids"].shape[0]
        average = self.average_logprobs
        ref = self.reference.apply(response_sequence_logprobs, input_ids, attention_mask, response_mask, average)  # (2B,)
        ref_model = self._modules.get("ref_model")
        if ref_model is not None:
            reshard(ref_model)  # under FSDP: free the root weights a no-grad pass leaves gathered
        with train_mode(self.model):  # what activates gradient checkpointing (dropout is off)
            policy = response_sequence_logprobs(self.model, input_ids, attention_mask, response_mask, average)  # (2B,)
        return {"logps_chosen": policy[:B], "logps_rejected": policy[B:],
                "ref_logps_chosen": ref[:B].detach(), "ref_logps_rejected": ref[B:].detach()}  # fmt: skip

    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The configured DPO-family loss of ``batch`` and its statistics (:func:`~rlhf_lit.functional.dpo_loss`)."""
        lp = self.pair_logprobs(batch)
        return dpo_loss(lp["logps_chosen"], lp["logps_rejected"], lp["ref_logps_chosen"], lp["ref_logps_rejected"],
                        self.beta, self.loss_kind, self.label_smoothing)  # fmt: skip

    # ----- training and validation -------------------------------------------------------------------

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """The DPO loss; logs it, the implicit-reward statistics and the learning rate."""
        loss, stats = self.loss(batch)
        B = batch["chosen_input_ids"].shape[0]
        self.log("train/loss", loss, prog_bar=True, batch_size=B)
        for name in METRICS:
            self.log(f"train/{name}", stats[name], prog_bar=name == "reward_accuracy", batch_size=B)
        self.log("lr", self.optimizers().param_groups[0]["lr"], batch_size=B)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        """Loss and statistics, averaged over the validation pairs (weighted by batch size)."""
        loss, stats = self.loss(batch)
        B = batch["chosen_input_ids"].shape[0]
        self.log("val/loss", loss, prog_bar=True, batch_size=B, sync_dist=True)
        for name in METRICS:
            self.log(f"val/{name}", stats[name], prog_bar=name == "reward_accuracy", batch_size=B, sync_dist=True)

    def configure_model(self) -> None:
        """Shard policy and frozen reference under FSDP (``fsdp`` / ``fsdp2``); no-op otherwise."""
        shard_models(self, {"model": self.model, "reference": self._modules.get("ref_model")})

    def configure_optimizers(self) -> dict:
        """AdamW over the policy's trainable weights (never the reference's), warmup and decay."""
        return lightning_optimizers(self.model, self.optimizer_config, self.trainer.estimated_stepping_batches)

    def on_fit_start(self) -> None:
        """Refuse an export target the end of fit could not write, before any training step."""
        check_export_at_fit_start(self.trainer, self.export_dir, self.export_existing)
        warn_if_slow_precision(self.trainer)

    def on_fit_end(self) -> None:
        """Export the trained policy and its tokenizer in Hugging Face format (rank 0)."""
        self.exported_path = export_at_fit_end(
            self.trainer, exportable(self.model), self.tokenizer, self.export_dir, "DPO policy", self.export_existing
        )

    # ----- checkpoints -------------------------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Refuse non-finite weights, keep the skip counters, and leave the frozen reference out."""
        super().on_save_checkpoint(checkpoint)
        state = checkpoint["state_dict"]
        checkpoint["state_dict"] = {k: v for k, v in state.items() if not k.startswith(self.FROZEN_PREFIXES)}

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Load weights; the reference (:attr:`FROZEN_PREFIXES`) may be missing: it was reloaded from
        ``model``. Any other missing or unknown weight is refused when ``strict``."""
        result = super().load_state_dict(state_dict, strict=False, assign=assign)
        check_loaded_keys(result.missing_keys, result.unexpected_keys, self.FROZEN_PREFIXES, strict)
        return result

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

By default the reference logprobs are computed per batch (one no-grad forward pass per step).
With ``precompute_ref`` they are computed once over the training and validation pairs when
training starts and looked up by content afterwards (any order, any shuffle); a pair not in the
table is computed as usual. The reference stays loaded either way (a cheaper step, not less memory)
until training ends: then it is released with the optimizer state
(:meth:`~rlhf_lit.stages.base.StageModule.release_after_fit`).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import torch
from lightning.pytorch.utilities.model_helpers import is_overridden

from rlhf_lit.functional import (
    DPOLossKind,
    averages_over_tokens,
    batch_sequences,
    check_dpo_settings,
    dpo_loss,
    response_mask_from_prompt_length,
)
from rlhf_lit.models import load_causal_lm, response_sequence_logprobs
from rlhf_lit.models.memory import train_mode
from rlhf_lit.models.reference import build_reference
from rlhf_lit.models.sharding import reshard, shard_models
from rlhf_lit.stages.base import PretrainedStage, RunLayout, as_config, require_input
from rlhf_lit.stages.optim import OptimizerConfig

log = logging.getLogger(__name__)

METRICS = ("rewards_chosen", "rewards_rejected", "reward_accuracy", "reward_margin", "implicit_kl")
"""The statistics of :func:`rlhf_lit.functional.dpo_loss`, logged as ``train/<name>`` and ``val/<name>``."""


class DPOModule(PretrainedStage):
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
        beta: > 0, the strength of the implicit KL penalty towards the reference (DPO's beta; IPO's tau).
            Smaller lets the policy move further; typical 0.01 to 0.5.
        loss: the loss (:data:`~rlhf_lit.functional.dpo.DPOLossKind`): ``sigmoid`` (DPO; with
            ``label_smoothing`` conservative DPO) or ``ipo`` (token-averaged logprobs).
        label_smoothing: in [0, 0.5): the assumed probability that a preference label is flipped
            (conservative DPO); ``sigmoid`` only.
        optimizer: AdamW and learning-rate schedule; by default annealed linearly to 0 over the run.
        precompute_ref: compute the reference logprobs of every training and validation pair once,
            when training starts, instead of once per batch (see the module docstring). Needs a
            data module; not under ``fsdp``.
        stage_args: the loading, LoRA and export arguments of :class:`~rlhf_lit.stages.base.PretrainedStage`
            (``tokenizer``, ``missing_pad``, ``dtype``, ``export_dir``, ``export_existing``,
            ``max_skipped_updates``, ``revision``, ``trust_remote_code``, ``attn_implementation``, ``lora``,
            ``gradient_checkpointing``). With ``lora`` the reference is the policy with its adapters
            disabled (no second copy is loaded).
    """

    SAFE_ON_RESUME = PretrainedStage.SAFE_ON_RESUME + ("precompute_ref",)
    """Settings a resume may change: the stage's usual ones, and whether the reference table is used
    (it changes no number)."""

    FROZEN_PREFIXES = ("ref_model.",)
    """State-dict prefix of the frozen reference: never written to checkpoints, reloaded from ``model``."""

    run_layout = RunLayout("dpo", inputs={"model": "sft"})  # --run_dir: RUN_DIR/dpo/, model from RUN_DIR/sft/model
    EXPORT_WHAT = "DPO policy"

    def __init__(
        self,
        model: str | None = None,
        beta: float = 0.1,
        loss: DPOLossKind = "sigmoid",
        label_smoothing: float = 0.0,
        optimizer: OptimizerConfig = OptimizerConfig(lr=1e-6, schedule="linear", min_lr_ratio=0.0),
        precompute_ref: bool = False,
        **stage_args: Any,
    ) -> None:
        super().__init__(**stage_args)
        model = require_input(model, "model", "the SFT model to start from (also the frozen reference)")
        check_dpo_settings(beta, loss, label_smoothing)
        self.beta, self.loss_kind, self.label_smoothing = beta, loss, label_smoothing
        self.optimizer_config = as_config(OptimizerConfig, optimizer)
        self.keep_settings(optimizer=self.optimizer_config)
        self.tokenizer = self.load_tokenizer(model, "right")  # preference batches are right padded (docs/CONTRACTS.md)

        def load() -> torch.nn.Module:
            return load_causal_lm(model, self.tokenizer, self.loading)

        self.model = self.adapted(load(), "causal_lm")

        def frozen_copy() -> torch.nn.Module:  # only without LoRA: see build_reference
            self.ref_model = load().requires_grad_(False).eval()
            return self.ref_model

        self.reference = build_reference(self.model, frozen_copy)
        self.precompute_ref = precompute_ref
        self._ref_table: dict[bytes, tuple[float, float]] | None = None
        """With ``precompute_ref``: pair key -> (chosen, rejected) reference logprob; None before training."""

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
        input_ids, attention_mask = batch_sequences(batch, self.tokenizer.pad_token_id)  # (2B, T) x2
        prompt_length = batch["prompt_length"].repeat(2)  # (2B,)
        response_mask = response_mask_from_prompt_length(attention_mask, prompt_length)  # (2B, T)
        return input_ids, attention_mask, response_mask

    def _reference_logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor
    ) -> torch.Tensor:
        """``(2B,)`` reference sequence logprobs of a pair batch: one no-grad pass."""
        ref = self.reference.apply(
            response_sequence_logprobs, input_ids, attention_mask, response_mask, self.average_logprobs
        )  # (2B,)
        ref_model = self._modules.get("ref_model")
        if ref_model is not None:
            reshard(ref_model)  # under FSDP: free the root weights a no-grad pass leaves gathered
        return ref.detach()

    @staticmethod
    def pair_keys(batch: dict[str, torch.Tensor]) -> list[bytes]:
        """One key per pair from its content (real chosen and rejected tokens, prompt length), so a
        pair is found again in any batch, order or padding."""
        keys = []
        rows = zip(
            batch["chosen_input_ids"].tolist(),
            batch["chosen_attention_mask"].tolist(),
            batch["rejected_input_ids"].tolist(),
            batch["rejected_attention_mask"].tolist(),
            batch["prompt_length"].tolist(),
        )
        for c_ids, c_mask, r_ids, r_mask, prompt_length in rows:
            chosen = [t for t, m in zip(c_ids, c_mask) if m]
            rejected = [t for t, m in zip(r_ids, r_mask) if m]
            keys.append(hashlib.blake2b(repr((chosen, rejected, prompt_length)).encode(), digest_size=16).digest())
        return keys

    def _looked_up(self, batch: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """``(2B,)`` reference logprobs (chosen then rejected) from the precomputed table, or None
        unless every pair of ``batch`` is in it."""
        if self._ref_table is None:
            return None
        found = [self._ref_table.get(key) for key in self.pair_keys(batch)]
        if any(f is None for f in found):
            return None
        chosen, rejected = zip(*found)
        return torch.tensor(chosen + rejected, dtype=torch.float32, device=batch["chosen_input_ids"].device)  # (2B,)

    def pair_logprobs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Sequence logprobs of chosen and rejected responses under the policy (with gradient when
        enabled) and the reference (never), each ``(B,)``: ``logps_chosen``, ``logps_rejected``,
        ``ref_logps_chosen``, ``ref_logps_rejected``. Sums or token means, as the loss needs."""
        input_ids, attention_mask, response_mask = self._pair_inputs(batch)
        B = batch["chosen_input_ids"].shape[0]
        average = self.average_logprobs
        ref = self._looked_up(batch)  # (2B,) or None
        if ref is None:
            ref = self._reference_logprobs(input_ids, attention_mask, response_mask)  # (2B,)
        with train_mode(self.model):  # what activates gradient checkpointing (dropout is off)
            policy = response_sequence_logprobs(self.model, input_ids, attention_mask, response_mask, average)  # (2B,)
        return {
            "logps_chosen": policy[:B],
            "logps_rejected": policy[B:],
            "ref_logps_chosen": ref[:B],
            "ref_logps_rejected": ref[B:],
        }

    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The configured DPO-family loss of ``batch`` and its statistics (:func:`~rlhf_lit.functional.dpo_loss`)."""
        # the pair logprobs by the names dpo_loss takes them by
        return dpo_loss(
            **self.pair_logprobs(batch), beta=self.beta, kind=self.loss_kind, label_smoothing=self.label_smoothing
        )

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
        if self.precompute_ref and getattr(self, "_device_mesh", None) is not None:
            # Under FSDP every forward pass is a collective; a table miss on one rank would stall the others.
            raise ValueError("precompute_ref is not supported under fsdp: set precompute_ref: false")
        shard_models(self, {"model": self.model, "reference": self._modules.get("ref_model")})

    def check_before_fit(self) -> None:
        """Refuse ranking data and ``precompute_ref`` without a data module, before any training step."""
        # Duck-typed (stages never import data): PreferenceDataModule keeps its record format here.
        if getattr(self.trainer.datamodule, "format", None) == "rankings":
            raise ValueError(
                "DPO trains on preference pairs, but the data module reads format 'rankings' (K ranked responses per "
                "prompt): give DPO pair data (format fields or hh_rlhf, e.g. the best and the worst response of each "
                "ranking as chosen and rejected), or train a reward model on the rankings (RewardModelModule)"
            )
        if self.precompute_ref and self.trainer.datamodule is None:
            raise ValueError(
                "precompute_ref needs a data module (fit with datamodule=...), or set precompute_ref: false"
            )

    def on_train_start(self) -> None:
        """With ``precompute_ref``: the reference logprobs of every training and validation pair, once."""
        if self.precompute_ref and self._ref_table is None:
            self.precompute_reference_logprobs()

    @torch.no_grad()
    def precompute_reference_logprobs(self) -> int:
        """Fill the reference table from the data module's training and validation loaders (unsharded:
        every process computes the whole table) under the Trainer's precision; returns its size."""
        dm = self.trainer.datamodule
        loaders = [dm.train_dataloader()]
        if is_overridden("val_dataloader", dm):
            loaders.append(dm.val_dataloader())
        table: dict[bytes, tuple[float, float]] = {}
        with self.trainer.precision_plugin.forward_context():
            for loader in loaders:
                for batch in loader:
                    batch = {k: v.to(self.device) for k, v in batch.items() if isinstance(v, torch.Tensor)}
                    ref = self._reference_logprobs(*self._pair_inputs(batch)).float().tolist()  # (2B,)
                    B = len(ref) // 2
                    table.update(zip(self.pair_keys(batch), zip(ref[:B], ref[B:])))
        self._ref_table = table
        log.info("precomputed the reference logprobs of %d preference pairs", len(table))
        return len(table)

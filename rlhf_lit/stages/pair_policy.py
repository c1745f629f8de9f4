"""What DPO and BoNBoN share: a policy trained on preference pairs against a frozen reference.

:class:`PairPolicyStage` holds the machinery; a stage built on it loads its models with
:meth:`PairPolicyStage.load_policy_and_reference`, says whether its loss reads token-averaged
sequence logprobs (:attr:`PairPolicyStage.average_logprobs`) and writes :meth:`PairPolicyStage.loss`.
It reads the same preference batches as the reward model (``PreferenceDataModule``) and needs their
``prompt_length`` field to know where each response starts. Details followed:

- the reference is the model the policy starts from, frozen (no gradients, eval mode,
  ``torch.no_grad``); with LoRA it is the policy with its adapters switched off, so no second copy
  is loaded (:func:`rlhf_lit.models.reference.build_reference`). It is never written into
  checkpoints and reloaded from ``model`` instead (house rule 7);
- sequence logprobs count the response tokens only (prompt and pads masked, positions from the
  attention mask, logits shifted by one), summed or averaged as the loss says;
- chosen and rejected sequences go through each model in ONE forward pass (concatenated along
  the batch), the reference's once per batch, without gradients;
- dropout is off in both models (the loaders), so policy and reference agree exactly before the
  first update.

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

import torch
from lightning.pytorch.utilities.model_helpers import is_overridden

from rlhf_lit.functional import batch_sequences, response_mask_from_prompt_length
from rlhf_lit.models import load_causal_lm, response_sequence_logprobs
from rlhf_lit.models.memory import train_mode
from rlhf_lit.models.reference import build_reference
from rlhf_lit.models.sharding import reshard, shard_models
from rlhf_lit.stages.pretrained import PretrainedStage

log = logging.getLogger(__name__)


class PairPolicyStage(PretrainedStage):
    """A causal-LM policy trained on (chosen, rejected) pairs against a frozen reference, then exported.

    Logs ``train/loss``, ``lr`` and the loss's statistics (:attr:`STATISTICS`) as ``train/<name>`` every
    step; the same under ``val/`` (pair-weighted means over the validation set) when the data module has
    validation pairs. At the end of fit the policy and tokenizer are exported in Hugging Face format
    (``AutoModelForCausalLM.from_pretrained(export_dir)``).
    """

    SAFE_ON_RESUME = PretrainedStage.SAFE_ON_RESUME + ("precompute_ref",)
    """Settings a resume may change: the stage's usual ones, and whether the reference table is used
    (it changes no number)."""

    FROZEN_PREFIXES = ("ref_model.",)
    """State-dict prefix of the frozen reference: never written to checkpoints, reloaded from ``model``."""

    STATISTICS: tuple[str, ...] = ()
    """The names of the loss's statistics, logged as ``train/<name>`` and ``val/<name>``."""

    LOSS_NAME = "this stage"
    """The loss, as messages name it (``DPO``, ``BoNBoN``)."""

    def load_policy_and_reference(self, model: str, precompute_ref: bool) -> None:
        """Load the tokenizer (right padded, as preference batches are), the policy from ``model`` (with
        LoRA and the other loading options) and the frozen reference (a copy of ``model``, or the
        policy with its adapters off)."""
        self.tokenizer = self.load_tokenizer(model, "right")  # preference batches are right padded (docs/CONTRACTS.md)

        def load() -> torch.nn.Module:
            return load_causal_lm(model, self.tokenizer, self.loading)

        self.model = self.adapted(load(), "causal_lm")

        def frozen_copy() -> torch.nn.Module:  # only without LoRA: see build_reference
            self.ref_model = load().requires_grad_(False).eval()
            self.keep_trunk(self.ref_model)  # the policy's frozen blocks: one store for both
            return self.ref_model

        self.reference = build_reference(self.model, frozen_copy)
        self.precompute_ref = precompute_ref
        self._ref_table: dict[bytes, tuple[float, float]] | None = None
        """With ``precompute_ref``: pair key -> (chosen, rejected) reference logprob; None before training."""

    @property
    def average_logprobs(self) -> bool:
        """Whether the loss reads token-averaged sequence logprobs rather than sums (sums unless a stage says)."""
        return False

    def train(self, mode: bool = True) -> PairPolicyStage:
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
                f"{type(self).__name__} needs preference batches with prompt_length (B,), the number of prompt "
                "tokens (rlhf_lit.data.PreferenceDataModule gives it; see docs/CONTRACTS.md)"
            )
        input_ids, attention_mask = batch_sequences(batch, self.tokenizer.pad_token_id)  # (2B, T) x2
        prompt_length = batch["prompt_length"].repeat(2)  # (2B,)
        response_mask = response_mask_from_prompt_length(attention_mask, prompt_length)  # (2B, T)
        return input_ids, attention_mask, response_mask

    def trunk_rows(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows policy and reference read (``cache_frozen``'s prefill): chosen then rejected."""
        return self._pair_inputs(batch)[:2]

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
        """The stage's loss of ``batch`` (from :meth:`pair_logprobs`) and its statistics (:attr:`STATISTICS`)."""
        raise NotImplementedError

    # ----- training and validation -------------------------------------------------------------------

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """The loss; logs it, its statistics and the learning rate."""
        loss, stats = self.loss(batch)
        B = batch["chosen_input_ids"].shape[0]
        self.log("train/loss", loss, prog_bar=True, batch_size=B)
        for name in self.STATISTICS:
            self.log(f"train/{name}", stats[name], prog_bar=name == "reward_accuracy", batch_size=B)
        self.log("lr", self.optimizers().param_groups[0]["lr"], batch_size=B)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        """Loss and statistics, averaged over the validation pairs (weighted by batch size)."""
        loss, stats = self.loss(batch)
        B = batch["chosen_input_ids"].shape[0]
        self.log("val/loss", loss, prog_bar=True, batch_size=B, sync_dist=True)
        for name in self.STATISTICS:
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
                f"{self.LOSS_NAME} trains on preference pairs, but the data module reads format 'rankings' (K ranked "
                f"responses per prompt): give {self.LOSS_NAME} pair data (format fields or hh_rlhf, e.g. the best and "
                "the worst response of each ranking as chosen and rejected), or train a reward model on the rankings "
                "(RewardModelModule)"
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

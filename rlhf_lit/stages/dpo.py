"""Direct preference optimisation (DPO): the policy trained on preference pairs against a frozen reference.

A stage beside SFT, RM and PPO (Rafailov et al. 2023): no reward model, no sampling. Its machinery
(pair batches, the frozen reference, LoRA, strategies, the precomputed reference table, export) is
:class:`~rlhf_lit.stages.pair_policy.PairPolicyStage`'s, whose docstring lists the details followed;
this module holds DPO's settings and loss. Sequence logprobs are summed for DPO and averaged for IPO
(:mod:`rlhf_lit.functional.dpo` explains why). Dropout is off in both models, so policy and reference
agree exactly before the first update: the loss starts at log 2 for ``loss="sigmoid"``.

By default the reference logprobs are computed per batch (one no-grad forward pass per step);
``precompute_ref`` computes them once when training starts.
"""

from __future__ import annotations

from typing import Any

import torch

from rlhf_lit.functional import DPOLossKind, averages_over_tokens, check_dpo_settings, dpo_loss
from rlhf_lit.stages.base import RunLayout, as_config, require_input
from rlhf_lit.stages.optim import OptimizerConfig
from rlhf_lit.stages.pair_policy import PairPolicyStage

METRICS = ("rewards_chosen", "rewards_rejected", "reward_accuracy", "reward_margin", "implicit_kl")
"""The statistics of :func:`rlhf_lit.functional.dpo_loss`, logged as ``train/<name>`` and ``val/<name>``."""


class DPOModule(PairPolicyStage):
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

    STATISTICS = METRICS
    LOSS_NAME = "DPO"
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
        self.load_policy_and_reference(model, precompute_ref)

    @property
    def average_logprobs(self) -> bool:
        """Whether the loss reads token-averaged sequence logprobs (IPO) rather than sums (DPO)."""
        return averages_over_tokens(self.loss_kind)

    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The configured DPO-family loss of ``batch`` and its statistics (:func:`~rlhf_lit.functional.dpo_loss`)."""
        # the pair logprobs by the names dpo_loss takes them by
        return dpo_loss(
            **self.pair_logprobs(batch), beta=self.beta, kind=self.loss_kind, label_smoothing=self.label_smoothing
        )

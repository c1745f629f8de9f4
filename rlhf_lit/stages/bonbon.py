"""BoNBoN: the policy taught to sample as best-of-N does (Gui, Garbacea, Veitch 2024, arXiv:2406.00832).

A stage beside DPO, on DPO's machinery (:class:`~rlhf_lit.stages.pair_policy.PairPolicyStage`: pair
batches, the frozen reference, LoRA, strategies, the precomputed reference table, export). Its
pairs are, per prompt, the best and the worst of N samples drawn from the reference policy itself
and ranked by a reward model or a judge (``rlhf-lit best-of-n --pairs-out``, which records N in
every record), as ``chosen`` and ``rejected``. The loss (:func:`rlhf_lit.functional.bonbon_loss`)
is SFT on the best plus IPO on the pair with the target the best-of-N distribution implies for N,
on sequence logprobs summed over response tokens: ``beta`` is derived from N,
``1 / (2 (N - 1) H_(N-1))`` (docs/bonbon.md), unless set.

N is the setting ``n``, or the records' ``n`` when the data module reads that column
(``extra_fields: [n]``); when both are there they must agree, record by record, which is checked
before any training step, as is a record whose ``n`` is not an integer >= 2.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from rlhf_lit.evaluation.best_of_n_pairs import N_KEY
from rlhf_lit.functional import bonbon_beta, bonbon_loss, check_bonbon_n, check_bonbon_settings
from rlhf_lit.stages.base import RunLayout, as_config, require_input
from rlhf_lit.stages.dpo import METRICS
from rlhf_lit.stages.optim import OptimizerConfig
from rlhf_lit.stages.pair_policy import PairPolicyStage

log = logging.getLogger(__name__)


class BoNBoNModule(PairPolicyStage):
    """Trains a causal-LM policy on best-and-worst-of-N pairs of its own reference's samples (BoNBoN) and
    exports it.

    Logs what DPO logs (``train/loss``, ``lr``, ``train/rewards_chosen`` and ``train/rewards_rejected``, the
    implicit rewards ``beta (log pi - log pi_ref)`` of the best and the worst, ``train/reward_accuracy``,
    ``train/reward_margin``, ``train/implicit_kl``) and the two terms before weighting, ``train/sft_loss``
    (``-log pi(best)``, summed over its tokens) and ``train/ipo_loss``; the same under ``val/``. The export
    loads with ``AutoModelForCausalLM.from_pretrained``.

    Args:
        model: Hub name or local directory of the causal LM to start from: the policy that drew the samples
            (best-of-N is of THIS policy), also the frozen reference (a copy; with ``lora``, the policy's own
            base weights).
        n: N, the samples per prompt the best and the worst were picked from (>= 2). None: the records' ``n``
            (the data module must read it: ``extra_fields: [n]``). Given, every record that has ``n`` must
            agree.
        alpha: in [0, 1], the weight of the SFT term (``1 - alpha`` the IPO term's). 0.005 by default: the IPO term
            carries the contrast, the SFT term keeps the best sample's likelihood from falling with the worst's (docs/bonbon.md).
        beta: IPO's coefficient (> 0); None derives it from N, ``1 / (2 (N - 1) H_(N-1))``
            (:func:`~rlhf_lit.functional.bonbon_beta`). Setting it departs from BoNBoN.
        optimizer: AdamW and learning-rate schedule; by default annealed linearly to 0 over the run.
        precompute_ref: compute the reference logprobs of every training and validation pair once, when
            training starts, instead of once per batch (:mod:`~rlhf_lit.stages.pair_policy`). Needs a data
            module; not under ``fsdp``.
        stage_args: the loading, LoRA and export arguments of :class:`~rlhf_lit.stages.base.PretrainedStage`,
            as DPO's.
    """

    STATISTICS = (*METRICS, "sft_loss", "ipo_loss")
    LOSS_NAME = "BoNBoN"
    run_layout = RunLayout(
        "bonbon", inputs={"model": "sft"}
    )  # --run_dir: RUN_DIR/bonbon/, model from RUN_DIR/sft/model
    EXPORT_WHAT = "BoNBoN policy"

    def __init__(
        self,
        model: str | None = None,
        n: int | None = None,
        alpha: float = 0.005,
        beta: float | None = None,
        optimizer: OptimizerConfig = OptimizerConfig(lr=1e-6, schedule="linear", min_lr_ratio=0.0),
        precompute_ref: bool = False,
        **stage_args: Any,
    ) -> None:
        super().__init__(**stage_args)
        model = require_input(model, "model", "the policy that drew the samples (also the frozen reference)")
        if n is not None:
            check_bonbon_n(n)
        check_bonbon_settings(alpha, beta)
        self.n, self.alpha, self.beta_setting = n, alpha, beta
        self.optimizer_config = as_config(OptimizerConfig, optimizer)
        self.keep_settings(optimizer=self.optimizer_config)
        self.load_policy_and_reference(model, precompute_ref)

    @property
    def beta(self) -> float:
        """IPO's coefficient: ``beta`` when set, else derived from N (known once fit has read the records)."""
        if self.beta_setting is not None:
            return self.beta_setting
        if self.n is None:
            raise ValueError(
                "BoNBoNModule does not know N yet: set n, or fit with a data module that reads the records' n "
                "(extra_fields: [n]); the coefficient beta is derived from it"
            )
        return bonbon_beta(self.n)

    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The BoNBoN loss of ``batch`` (chosen = the best of N, rejected = the worst) and its statistics
        (:func:`~rlhf_lit.functional.bonbon_loss`)."""
        lp = self.pair_logprobs(batch)
        return bonbon_loss(
            lp["logps_chosen"],
            lp["logps_rejected"],
            lp["ref_logps_chosen"],
            lp["ref_logps_rejected"],
            beta=self.beta,
            alpha=self.alpha,
        )

    def check_before_fit(self) -> None:
        """DPO's refusals, then N: the records' ``n`` checked against ``n`` (or read into it), before any step."""
        super().check_before_fit()
        self.n = self.resolved_n(self.trainer.datamodule)
        if self.beta_setting is None:
            log.info(
                "BoNBoN: N = %d, beta = 1 / (2 (N - 1) H_(N-1)) = %.6g (IPO target %.6g)",
                self.n,
                self.beta,
                1 / (2 * self.beta),
            )
        else:
            log.info("BoNBoN: beta = %.6g as set (not derived from N)", self.beta)

    def resolved_n(self, datamodule: Any) -> int | None:
        """N from ``n`` and the records ``datamodule`` read (duck-typed: ``extra_fields``, ``extra_values``).

        Raises ValueError naming the record for an ``n`` that is not an integer >= 2, that differs from the
        setting ``n``, or (``n`` unset) from the first record's; and when N is known from neither while
        ``beta`` is unset."""
        if N_KEY not in (getattr(datamodule, "extra_fields", None) or ()):
            if self.n is None and self.beta_setting is None:
                raise ValueError(
                    "BoNBoN needs N, the samples per prompt the pairs were picked from: set model.init_args.n, or "
                    f"read the records' {N_KEY!r} with data.init_args.extra_fields: [{N_KEY}] "
                    "(rlhf-lit best-of-n --pairs-out records it)"
                )
            if self.n is not None:
                log.info(
                    "BoNBoN: the records' n is not read (no extra_fields: [n]), so not checked against n = %d", self.n
                )
            return self.n
        first: tuple[str, int] | None = None
        for where, value in datamodule.extra_values(N_KEY):
            try:
                check_bonbon_n(value)
            except ValueError:
                raise ValueError(f"{where}: field {N_KEY!r} must be an integer >= 2, got {value!r}") from None
            if self.n is not None and value != self.n:
                raise ValueError(
                    f"{where}: field {N_KEY!r} is {value}, but BoNBoN's n is {self.n}: beta is derived from N, so "
                    f"the pairs must be best and worst of n samples; set model.init_args.n: {value} (or null, to "
                    "read it from the records), or give pairs drawn with that N"
                )
            if first is None:
                first = (where, value)
            elif value != first[1]:
                raise ValueError(
                    f"{where}: field {N_KEY!r} is {value}, but {first[0]} has {first[1]}: the pairs of one run "
                    "come from one N (BoNBoN's beta is derived from it)"
                )
        return self.n if first is None else first[1]

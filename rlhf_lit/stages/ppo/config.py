"""Nested settings of the PPO stage (the ``model.init_args.ppo`` / ``reward`` / ``kl`` YAML groups).

Each dataclass is frozen (an instance default in a signature is then safe to share) and checks
its own values; settings that cannot work together raise here, nothing is rewritten silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal, get_args

import torch

from rlhf_lit.functional import (
    AGGREGATES,
    CALIBRATION_TRANSFORMS,
    Aggregate,
    CalibrationTransform,
    KLKind,
    KLLossKind,
    KLMode,
    PolicyLossKind,
    Reducer,
    ScoreWhitening,
    shape_scores,
)
from rlhf_lit.functional.advantages import EstimatorKind
from rlhf_lit.models.compiled_passes import ForwardPasses
from rlhf_lit.models.scoring import UnfinishedScoring
from rlhf_lit.option_values import check_choice, check_finite, check_least

OldLogprobs = Literal["rescore", "sampling"]
"""Where a rollout's old logprobs come from (see ``PPOConfig.old_logprobs``)."""

Calibration = Literal["none", "reference_quantile"]
"""Whether the raw score is calibrated (see ``RewardConfig.calibration``): ``none``, or
``reference_quantile``, its quantile among the reference policy's samples for the same prompt."""

WhitenScope = Literal["global", "rank"]
"""Over which rows every whitening takes its mean and variance (``PPOConfig.whiten_scope``):
``global``, the rollout batch of all processes together (one statistic, whatever the number of
processes; two small all-reduces per whitening); ``rank``, each process's own rows (TRL's way: the
update then depends on how the batch is split). On one process the two are the same statistic."""


@dataclass(frozen=True)
class PPOConfig:
    """The PPO update run on every rollout.

    Args:
        epochs: passes over the rollout (K in the PPO paper; N+ uses 4).
        minibatch_size: rows per forward/backward pass. An optimizer step is taken every
            ``grad_accum`` minibatches, so one step sees ``minibatch_size * grad_accum`` rows; the
            rollout batch must be a multiple of that.
        grad_accum: minibatches whose gradients are summed before one optimizer step.
        clip_range: epsilon of the clipped policy surrogate.
        policy_loss: the policy loss (:data:`~rlhf_lit.functional.policy_losses.PolicyLossKind`):
            ``clipped``, PPO's clipped surrogate, a token mean over the minibatch (Schulman et al.
            2017, eq. 7). How a variant is added: :mod:`rlhf_lit.functional.policy_losses`.
        value_clip_range: how far a value may move from its rollout value (N detail 13: 0.2).
        vf_coef: weight of the value loss in the summed loss (N detail 13: 0.1).
        gamma: discount of GAE (1 in RLHF: the episode is one response).
        lam: lambda of GAE (N detail 12: 0.95).
        whiten_advantages: whiten GAE advantages over the rollout batch (masked), as every PPO-RLHF
            implementation does. Applies to ``estimator: gae``; the critic-free estimators
            normalise as their papers define (group std, leave-one-out, batch whitening).
        whiten_scope: the batch every whitening is taken over (:data:`WhitenScope`): ``global``
            (all processes' rows together: the same update on any number of processes) or
            ``rank`` (each process's rows, as TRL). It applies to the GAE advantages, REINFORCE++'s
            returns and ``reward.whiten`` (``scores`` and ``rewards``); the group estimators
            (``grpo``, ``dr_grpo``, ``rloo``) normalise within a prompt's samples, which are always
            on one process.
        entropy_coef: weight of an entropy bonus (0 = off; InstructGPT uses none).
        max_grad_norm: clip the gradient norm of each optimizer's parameters (None = no clipping).
        ptx_coef: weight of the pretraining / SFT loss on batches from a second data source
            (InstructGPT's PPO-ptx; 0 = off). Needs a data module with ``ptx_dataloader()``.
        score_chunk_size: rows per no-grad forward pass when scoring a rollout (old logprobs,
            reference logprobs, values, reward); None = the whole batch at once. Bounds memory,
            and can save work: chunks take rows of similar prompt length, and each pass skips the
            padding none of a chunk's rows attends (left of the longest prompt, right of the
            longest response).
        estimator: the advantage estimator (:data:`~rlhf_lit.functional.advantages.EstimatorKind`):
            ``gae`` (critic + GAE, the InstructGPT path), ``grpo`` / ``dr_grpo`` / ``rloo``
            (group baselines over ``sampling.samples_per_prompt`` >= 2 responses per prompt) or
            ``reinforce_pp`` (returns whitened over the batch). Only ``gae`` builds and trains a
            critic; the others load none and have one optimizer (``critic``, ``value_model``,
            ``critic_lora``, ``critic_optimizer``, ``vf_coef`` and ``value_clip_range`` then do
            nothing; the first four must be left at their defaults).
        old_logprobs: where the rollout's old logprobs (and its entropy) come from: ``rescore``, a
            no-grad forward pass of the policy over the rollout, so the ratio is exactly 1 before
            the first update on any hardware; or ``sampling``, the logprobs of the sampled tokens
            (and the entropies) recorded from the logits ``generate`` drew them from, step by step
            (TRL's way, without keeping the logits: ``(B, R)`` floats, not ``(B, R, vocabulary)``):
            one policy forward less per rollout, equal to the rescore up to float rounding (the
            KV-cache steps multiply in another order: measured <= 1e-5 in fp32 on a CPU, ~2e-3 in
            bf16; logged each rollout as ``policy/logprob_gen_train_diff``). With ``critic:
            shared_trunk`` the policy forward runs anyway for the values.
        forward: how the policy and critic forward passes of the scoring and minibatch passes
            run (:data:`~rlhf_lit.models.compiled_passes.ForwardPasses`): ``eager``, op by op; or
            ``compiled``, through ``torch.compile`` on rows padded to a few lengths
            (:class:`~rlhf_lit.models.compiled_passes.BucketedCompile`; the same losses and
            gradients within float32 rounding, graphs counted and logged as ``compile/forward_*``).
            Refused under FSDP. The default stays ``eager``: see docs/performance.md for what
            compiling bought on the machines measured.
        remove_padding: run the eager teacher-forced passes of a rollout (scoring: policy,
            reference, critic, reward model; the minibatch updates: policy and critic) over the
            rows' real tokens packed into one sequence, not over padded rows
            (:mod:`rlhf_lit.models.packing`): the same outputs up to the order of float sums, for
            the work of the real tokens. A model whose attention cannot be packed (checked once
            per model, on the model) keeps its padded passes, with a warning. Off by default: with
            SDPA the packed sequence's attention is one dense ``N x N`` masked product, which on
            the CPU cost more than the padding saved (docs/performance.md); it pays where the
            attention is variable-length (``flash_attention_2``) or rows differ far in length.
        reuse_first_forward: run the update's first minibatch forward (policy and critic, with
            gradients) while the rollout is scored, and take those rows' old logprobs, entropy and
            values from it instead of a scoring pass (:mod:`~rlhf_lit.stages.ppo.first_forward`):
            the weights have not changed yet, so it is the same pass (up to the order of float
            sums), and one minibatch's policy and critic scoring is saved per rollout. It holds that
            minibatch's graph while the other rows are scored: turn it off where memory is tight.
    """

    epochs: int = 4
    minibatch_size: int = 8
    grad_accum: int = 1
    clip_range: float = 0.2
    value_clip_range: float = 0.2
    vf_coef: float = 0.1
    gamma: float = 1.0
    lam: float = 0.95
    whiten_advantages: bool = True
    whiten_scope: WhitenScope = "global"
    entropy_coef: float = 0.0
    max_grad_norm: float | None = 1.0
    ptx_coef: float = 0.0
    score_chunk_size: int | None = None
    estimator: EstimatorKind = "gae"
    old_logprobs: OldLogprobs = "rescore"
    forward: ForwardPasses = "eager"
    remove_padding: bool = False
    reuse_first_forward: bool = True
    policy_loss: PolicyLossKind = "clipped"

    def __post_init__(self) -> None:
        check_choice("ppo.forward", self.forward, get_args(ForwardPasses))
        check_choice("ppo.old_logprobs", self.old_logprobs, get_args(OldLogprobs))
        check_choice("ppo.whiten_scope", self.whiten_scope, get_args(WhitenScope))
        check_choice("ppo.policy_loss", self.policy_loss, get_args(PolicyLossKind))
        check_choice("ppo.estimator", self.estimator, get_args(EstimatorKind))
        for name in ("epochs", "minibatch_size", "grad_accum"):
            check_least(f"ppo.{name}", getattr(self, name), 1)
        for name in ("clip_range", "value_clip_range"):
            check_least(f"ppo.{name}", getattr(self, name), 0, strict=True)
        for name in ("vf_coef", "entropy_coef", "ptx_coef"):
            check_least(f"ppo.{name}", getattr(self, name), 0)
            check_finite(f"ppo.{name}", getattr(self, name))  # inf times a zero term is a NaN loss
        if not 0.0 <= self.gamma <= 1.0 or not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"ppo.gamma and ppo.lam must be in [0, 1], got {self.gamma}, {self.lam}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"ppo.max_grad_norm must be > 0 or null, got {self.max_grad_norm}")
        if self.score_chunk_size is not None and self.score_chunk_size < 1:
            raise ValueError(f"ppo.score_chunk_size must be >= 1 or null, got {self.score_chunk_size}")

    @property
    def rows_per_step(self) -> int:
        """Rows behind one optimizer step: ``minibatch_size * grad_accum``."""
        return self.minibatch_size * self.grad_accum


@dataclass(frozen=True)
class RewardSource:
    """One term of the score: the learned reward model or a reward function, with a weight.

    Args:
        name: logged as ``reward/<name>`` (a function's dict components as
            ``reward/<name>/<component>``) and named in errors; unique among the sources.
        weight: multiplies the source's score (the sum of its components) in the total.
        function: ``"module:function"`` of a reward function
            (:func:`rlhf_lit.rewards.load_reward_function`, e.g.
            ``rlhf_lit.rewards.shaping:length_target``), called on a
            :class:`~rlhf_lit.rewards.RewardBatch`; null = the learned reward model
            (``model.reward_model``).
        kwargs: keyword parameters of the function (null function: must be empty).
        aggregate: when ``model.reward_model`` is a reward-model ensemble, how its members' normalised
            scores become this source's score (:data:`~rlhf_lit.functional.Aggregate`): ``mean``,
            ``uncertainty_weighted`` (mean - ``lam`` * the members' population std) or ``worst_case``
            (the members' minimum). The reward model only; a single reward model takes ``mean``.
        lam: the std's weight lambda of ``uncertainty_weighted`` (>= 0; required there, unset otherwise).
    """

    name: str
    weight: float = 1.0
    function: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    aggregate: Aggregate = "mean"
    lam: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise ValueError(f"reward.sources: a name must be a non-empty string without '/', got {self.name!r}")
        if self.function is None and self.kwargs:
            raise ValueError(f"reward source {self.name!r} is the reward model (function: null); it takes no kwargs")
        where = f"reward source {self.name!r}"
        check_finite(f"{where}: weight", self.weight)  # a NaN weight made every reward NaN, each update skipped
        check_choice(f"{where}: aggregate", self.aggregate, AGGREGATES)
        if self.function is not None and (self.aggregate != "mean" or self.lam is not None):
            raise ValueError(
                f"{where} is a reward function; aggregate and lam apply to the reward model (function: null)"
            )
        if self.lam is not None and not self.lam >= 0:
            raise ValueError(f"{where}: lam must be >= 0, got {self.lam}")
        if self.aggregate == "uncertainty_weighted" and self.lam is None:
            raise ValueError(
                f"{where}: aggregate uncertainty_weighted needs lam (the weight of the members' std), e.g. lam: 0.5"
            )
        if self.aggregate != "uncertainty_weighted" and self.lam is not None:
            raise ValueError(
                f"{where}: lam applies to aggregate uncertainty_weighted only (aggregate is {self.aggregate})"
            )


def _default_sources() -> list[RewardSource]:
    return [RewardSource(name="reward_model")]


@dataclass(frozen=True)
class RewardConfig:
    """How the sources' scores become the reward of a response.

    Order of operations: the reward model reads the response (``unfinished``); ``sum of weight *
    source score`` (the raw score) -> calibration (``calibration``) -> ``score - bias`` ->
    whiten (``scores``) -> clip -> missing-EOS penalty -> per-token KL shaping (the score at the
    last response token) -> whiten (``rewards``).

    Args:
        sources: the terms of the raw score (:class:`RewardSource`); default: the learned reward
            model with weight 1 (the InstructGPT reward). Each is logged as ``reward/<name>``.
        bias: subtracted from every RM score (N+ details: a bias so that reference responses
            average 0; measure it on SFT samples).
        whiten: see :data:`~rlhf_lit.functional.ScoreWhitening`; over the batch of every process
            or of each (``ppo.whiten_scope``).
        clip: clip the (biased, whitened) score to ``[-clip, clip]``; None = no clipping.
        missing_eos_penalty: when set, a response that never produced EOS gets this score
            INSTEAD of its RM score (replace, as in N+ detail 9, not add: a truncated response
            is not a response the RM was trained to judge). None = no penalty. Must be <= 0:
            TRL's option of the same name is a positive amount subtracted from the score, so a
            ported ``1.0`` here would pay every unfinished response +1 (docs/from-trl.md).
        unfinished: how the reward model reads a response without EOS
            (:data:`~rlhf_lit.models.scoring.UnfinishedScoring`):
            ``as_sampled`` or ``with_eos``. Only ``as_sampled`` goes with a ``missing_eos_penalty``,
            which replaces those scores anyway; reward functions read text and are not affected.
        calibration: ``reference_quantile`` replaces the raw score (every source's weighted sum, an
            ensemble's aggregate included) by its mid-quantile among the raw scores of
            ``calibration_samples`` responses the frozen reference policy samples for the same
            prompt each rollout (same sampling settings, its own seed stream), then applies
            ``calibration_transform`` (BoNBoN, Gui et al. 2024; InfAlign, Balashankar et al. 2025;
            :mod:`rlhf_lit.functional.calibration`). ``none`` (default): the raw score as it is.
            Logged: ``reward/calibrated``, ``reward/quantile``, ``reward/reference`` (the reference
            samples' mean raw score), ``time/reference_s``; ``objective/scores`` stays the raw score.
        calibration_transform: what the quantile q becomes
            (:data:`~rlhf_lit.functional.CalibrationTransform`): ``identity`` (q, in (0, 1)),
            ``log`` (log q: with ``kl.kind: fixed``, ``kl.init_coef`` 1 / (n - 1), the optimum is the
            best-of-n policy for continuous rewards) or ``best_of_n`` (exact for tied / discrete
            scores too; needs ``calibration_n``).
        calibration_samples: K, the reference samples per prompt (drawn once per prompt of a
            rollout, shared by its ``samples_per_prompt`` rows); the quantile moves in steps of
            1 / (K + 1) and lies in [0.5 / (K + 1), (K + 0.5) / (K + 1)].
        calibration_n: best-of-n's n (>= 2) of ``calibration_transform: best_of_n``; unset otherwise.
    """

    sources: list[RewardSource] = field(default_factory=_default_sources)
    bias: float = 0.0
    whiten: ScoreWhitening = "none"
    clip: float | None = None
    missing_eos_penalty: float | None = None
    unfinished: UnfinishedScoring = "as_sampled"
    calibration: Calibration = "none"
    calibration_transform: CalibrationTransform = "identity"
    calibration_samples: int = 8
    calibration_n: int | None = None

    def shape(self, raw_scores: torch.Tensor, ended: torch.Tensor, reduce_sum: Reducer | None = None) -> torch.Tensor:
        """Bias, score whitening, clipping and the missing-EOS penalty, in that order
        (:func:`rlhf_lit.functional.shape_scores` with this config's settings).

        Args:
            raw_scores: ``(B,)`` reward-model scores.
            ended: ``(B,)`` bool, the response contains EOS.
            reduce_sum: sums over the processes (whitening over all of them, ``ppo.whiten_scope:
                global``); None = over these scores.

        Returns:
            ``(B,)`` the scores that enter the reward.
        """
        return shape_scores(
            raw_scores, ended, self.bias, self.whiten, self.clip, self.missing_eos_penalty, reduce_sum
        )  # (B,)

    @property
    def uses_reward_model(self) -> bool:
        """Whether a source is the learned reward model (which must then be loaded)."""
        return any(source.function is None for source in self.sources)

    def __post_init__(self) -> None:
        # A dict per source when read back from hyperparameters (asdict): rebuild the dataclasses.
        sources = [RewardSource(**s) if isinstance(s, dict) else s for s in self.sources]
        object.__setattr__(self, "sources", sources)
        if not sources:
            raise ValueError("reward.sources must name at least one source")
        names = [s.name for s in sources]
        if len(set(names)) != len(names):
            raise ValueError(f"reward.sources: names must be unique, got {names}")
        if sum(s.function is None for s in sources) > 1:
            raise ValueError("reward.sources: the reward model (function: null) may appear once")
        if self.whiten not in ("none", "scores", "rewards"):
            raise ValueError(f"reward.whiten must be none, scores or rewards; got {self.whiten!r}")
        check_finite("reward.bias", self.bias)
        if self.clip is not None and not self.clip > 0:  # NaN too: clamping to it gives NaN
            raise ValueError(f"reward.clip must be > 0 or null, got {self.clip}")
        if self.missing_eos_penalty is not None:
            check_finite("reward.missing_eos_penalty", self.missing_eos_penalty)
        check_choice("reward.unfinished", self.unfinished, get_args(UnfinishedScoring))
        if self.missing_eos_penalty is not None and self.missing_eos_penalty > 0:
            # Refused, not warned: the sign is the whole meaning of the setting, and a positive
            # score is above the normalised RM's mean of 0, a reward for running out of tokens.
            raise ValueError(
                f"reward.missing_eos_penalty={self.missing_eos_penalty!r} is positive: it REPLACES the score of a "
                "response without EOS (TRL's missing_eos_penalty is subtracted from it instead), so a positive value "
                "pays unfinished responses; give the score they get instead, e.g. -1.0, or null"
            )
        self._check_calibration()
        if self.unfinished == "with_eos" and self.missing_eos_penalty is not None:
            raise ValueError(
                "reward.unfinished='with_eos' scores responses without EOS, and reward.missing_eos_penalty replaces "
                "those scores: set one of them (missing_eos_penalty: null, or unfinished: as_sampled)"
            )

    @property
    def calibrated(self) -> bool:
        """Whether the raw score is calibrated against reference samples (``calibration``)."""
        return self.calibration != "none"

    def _check_calibration(self) -> None:
        check_choice("reward.calibration", self.calibration, get_args(Calibration))
        check_choice("reward.calibration_transform", self.calibration_transform, CALIBRATION_TRANSFORMS)
        check_least("reward.calibration_samples", self.calibration_samples, 1)
        # Settings that would do nothing are refused, not ignored: they say the user meant calibration on.
        if not self.calibrated and (self.calibration_transform != "identity" or self.calibration_n is not None):
            raise ValueError(
                "reward.calibration_transform / calibration_n apply to reward.calibration: "
                "reference_quantile; reward.calibration is none"
            )
        if (self.calibration_transform == "best_of_n") != (self.calibration_n is not None):
            raise ValueError(
                "reward.calibration_n (best-of-n's n) goes with calibration_transform: best_of_n, and "
                f"only with it; got transform {self.calibration_transform}, n {self.calibration_n}"
            )
        if self.calibration_n is not None and self.calibration_n < 2:
            raise ValueError(
                f"reward.calibration_n must be >= 2 (the KL coefficient is 1 / (n - 1)), got {self.calibration_n}"
            )


KL_IN_NATS = ("k1", "k3")
"""The estimators whose expectation under the policy is KL(policy || reference) in nats."""


@dataclass(frozen=True)
class KLConfig:
    """The KL penalty to the frozen reference (Ziegler et al. 2019).

    Args:
        kind: ``adaptive`` steers the coefficient so the KL per response tracks ``target``
            (Ziegler et al. 2019; the InstructGPT recipe's default); ``fixed`` keeps ``init_coef``.
        init_coef: the KL coefficient beta at the start (N detail 11: 0.15; N+ fixed 0.05).
        target: KL per response (nats, summed over tokens) the adaptive controller aims for.
        horizon: samples over which the adaptive controller corrects a full error.
        estimator: per-token KL estimator (k1 = logprob - ref_logprob, the InstructGPT penalty) of
            the KL measured at rollout time: paid in the reward with ``mode: reward``, logged as
            ``objective/kl`` and read by the adaptive controller in both modes. The adaptive
            controller compares the summed estimate with ``target``, a KL in nats, so it accepts
            only the estimators whose expectation is that KL (``k1``, ``k3``); ``k2`` (half the
            squared log-ratio) and ``abs`` are penalties in other units and need ``kind: fixed``
            and ``mode: reward`` (with ``mode: loss`` the estimate is only measured, as a KL).
        mode: where the KL is paid. ``reward``: ``-beta * KL`` per token in the reward
            (InstructGPT, the default). ``loss``: no penalty in the reward; ``+ beta * KL`` as a
            loss term, the token mean of ``loss_estimator`` over the minibatch
            (:func:`~rlhf_lit.functional.kl_loss`; GRPO: beta 0.04). The adaptive controller
            updates from the KL measured at rollout time (``estimator``) in both modes.
        loss_estimator: what ``mode: loss`` differentiates
            (:data:`~rlhf_lit.functional.kl.KLLossKind`): ``k3_weighted`` (the default), k3 times
            the ratio pi / pi_old, whose gradient is that of KL(policy || reference) on the first
            minibatch and on those after an optimizer step alike; ``k2``, the same gradient on
            the first minibatch only (on-policy); ``k3``, GRPO's, whose gradient is a biased
            first-order stand-in (that of the forward KL(reference || policy)); ``exact``, the KL of
            the whole next-token distributions at each visited prefix, summed over the vocabulary, no
            sampled estimate (one more reference pass per minibatch; ``(B, R, V)`` of memory). Logged
            as ``loss/kl``. Only ``mode: loss`` reads it.
    """

    kind: Literal["fixed", "adaptive"] = "adaptive"
    init_coef: float = 0.15
    target: float = 6.0
    horizon: int = 10000
    estimator: KLKind = "k1"
    mode: KLMode = "reward"
    loss_estimator: KLLossKind = "k3_weighted"

    def __post_init__(self) -> None:
        if self.mode not in get_args(KLMode):
            raise ValueError(f"kl.mode must be reward or loss, got {self.mode!r}")
        if self.kind not in ("fixed", "adaptive"):
            raise ValueError(f"kl.kind must be fixed or adaptive, got {self.kind!r}")
        if self.estimator not in ("k1", "k2", "k3", "abs"):
            raise ValueError(f"kl.estimator must be k1, k2, k3 or abs; got {self.estimator!r}")
        check_choice("kl.loss_estimator", self.loss_estimator, get_args(KLLossKind))
        if self.mode == "loss" and self.estimator not in KL_IN_NATS:
            # What is only measured must be a KL: objective/kl and the controller read it as one.
            raise ValueError(
                f"kl.mode='loss' measures the KL with kl.estimator (objective/kl, the adaptive controller), so it "
                f"must be one of {', '.join(KL_IN_NATS)}, got {self.estimator!r}; the loss term's estimator is "
                f"kl.loss_estimator ({', '.join(get_args(KLLossKind))})"
            )
        default = next(f.default for f in fields(self) if f.name == "loss_estimator")
        if self.mode == "reward" and self.loss_estimator != default:
            raise ValueError(
                f"kl.loss_estimator={self.loss_estimator!r} applies to kl.mode='loss'; kl.mode is 'reward', which pays "
                "kl.estimator in the reward"
            )
        check_least("kl.init_coef", self.init_coef, 0)
        check_finite("kl.init_coef", self.init_coef)  # inf times the first rollout's KL of 0 is a NaN reward
        if self.kind == "adaptive" and self.estimator not in KL_IN_NATS:
            raise ValueError(
                f"kl.estimator={self.estimator!r} does not estimate the KL in nats that kl.target is measured "
                f"in; with kl.kind='adaptive' use one of {', '.join(KL_IN_NATS)}, or set kl.kind='fixed'"
            )

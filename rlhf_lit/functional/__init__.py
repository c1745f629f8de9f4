"""Pure tensor math for RLHF. Imports torch only (never lightning, transformers or rlhf_lit).

Shapes: ``(B, T)`` unless noted; a ``mask`` is a bool tensor, True where a position counts.
"""

from rlhf_lit.functional.advantages import (
    EstimatorKind,
    gae,
    grpo_advantages,
    needs_critic,
    needs_groups,
    reinforce_pp_advantages,
    rloo_advantages,
)
from rlhf_lit.functional.bonbon import bonbon_beta, bonbon_loss, bonbon_target, check_bonbon_n, check_bonbon_settings
from rlhf_lit.functional.calibration import (
    CALIBRATION_TRANSFORMS,
    CalibrationTransform,
    calibrated_scores,
    quantile_bounds,
    reference_quantiles,
    transform_quantiles,
)
from rlhf_lit.functional.dpo import DPOLossKind, averages_over_tokens, check_dpo_settings, dpo_loss
from rlhf_lit.functional.ensemble import AGGREGATES, Aggregate, aggregate_scores, member_std
from rlhf_lit.functional.kl import KLKind, KLLossKind, KLMode, exact_kl, kl_loss, kl_penalized_rewards, kl_penalty
from rlhf_lit.functional.kl_control import AdaptiveKLController, FixedKLController, KLController
from rlhf_lit.functional.logprobs import (
    entropy_from_logits,
    entropy_of,
    log_distributions,
    sequence_logprobs,
    token_logprobs,
)
from rlhf_lit.functional.losses import IGNORE_INDEX, clipped_value_loss, pairwise_reward_loss, sft_loss
from rlhf_lit.functional.masked_stats import (
    Reducer,
    explained_variance,
    masked_mean,
    masked_mean_var,
    masked_var,
    masked_whiten,
)
from rlhf_lit.functional.masks import (
    append_eos_to_unfinished,
    attended_span,
    last_true_index,
    length_groups,
    response_mask_from_eos,
    response_mask_from_prompt_length,
)
from rlhf_lit.functional.pairs import batch_sequences, concat_pairs, pad_ids, pad_right
from rlhf_lit.functional.policy_losses import POLICY_LOSSES, PolicyLoss, PolicyLossKind, ppo_policy_loss
from rlhf_lit.functional.ranking import (
    RankingMetrics,
    batch_examples,
    is_ranking_batch,
    ranking_loss,
    ranking_metrics,
    ranking_pair_mask,
    ranking_pairs,
)
from rlhf_lit.functional.score_shaping import ScoreWhitening, shape_scores

__all__ = [
    "AGGREGATES",
    "CALIBRATION_TRANSFORMS",
    "IGNORE_INDEX",
    "POLICY_LOSSES",
    "Aggregate",
    "CalibrationTransform",
    "AdaptiveKLController",
    "DPOLossKind",
    "EstimatorKind",
    "FixedKLController",
    "KLController",
    "KLKind",
    "KLLossKind",
    "KLMode",
    "PolicyLoss",
    "PolicyLossKind",
    "RankingMetrics",
    "Reducer",
    "ScoreWhitening",
    "aggregate_scores",
    "append_eos_to_unfinished",
    "averages_over_tokens",
    "batch_examples",
    "batch_sequences",
    "bonbon_beta",
    "bonbon_loss",
    "bonbon_target",
    "calibrated_scores",
    "check_bonbon_n",
    "check_bonbon_settings",
    "check_dpo_settings",
    "clipped_value_loss",
    "concat_pairs",
    "dpo_loss",
    "entropy_from_logits",
    "entropy_of",
    "log_distributions",
    "explained_variance",
    "gae",
    "is_ranking_batch",
    "grpo_advantages",
    "exact_kl",
    "kl_loss",
    "kl_penalized_rewards",
    "kl_penalty",
    "last_true_index",
    "attended_span",
    "length_groups",
    "masked_mean",
    "masked_mean_var",
    "masked_var",
    "masked_whiten",
    "member_std",
    "needs_critic",
    "needs_groups",
    "pad_ids",
    "pad_right",
    "pairwise_reward_loss",
    "ppo_policy_loss",
    "quantile_bounds",
    "ranking_loss",
    "ranking_metrics",
    "ranking_pair_mask",
    "ranking_pairs",
    "reference_quantiles",
    "reinforce_pp_advantages",
    "response_mask_from_eos",
    "response_mask_from_prompt_length",
    "rloo_advantages",
    "sequence_logprobs",
    "sft_loss",
    "shape_scores",
    "token_logprobs",
    "transform_quantiles",
]

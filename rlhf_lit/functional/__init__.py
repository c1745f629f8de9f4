"""Pure tensor math for RLHF. Imports torch only (never lightning, transformers or rlhf_lit).

Shapes: ``(B, T)`` unless noted; a ``mask`` is a bool tensor, True where a position counts.
"""

from rlhf_lit.functional.advantages import gae
from rlhf_lit.functional.kl import KLKind, kl_penalized_rewards, kl_penalty
from rlhf_lit.functional.kl_control import AdaptiveKLController, FixedKLController, KLController
from rlhf_lit.functional.logprobs import entropy_from_logits, token_logprobs
from rlhf_lit.functional.losses import clipped_value_loss, pairwise_reward_loss, ppo_policy_loss, sft_loss
from rlhf_lit.functional.masked import explained_variance, masked_mean, masked_var, masked_whiten
from rlhf_lit.functional.masks import last_true_index, response_mask_from_eos

__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "KLController",
    "KLKind",
    "clipped_value_loss",
    "entropy_from_logits",
    "explained_variance",
    "gae",
    "kl_penalized_rewards",
    "kl_penalty",
    "last_true_index",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "pairwise_reward_loss",
    "ppo_policy_loss",
    "response_mask_from_eos",
    "sft_loss",
    "token_logprobs",
]

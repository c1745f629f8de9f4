"""Model loading, reward/value scoring and generation helpers."""

from rlhf_lit.models.loading import disable_dropout, init_reward_head, load_causal_lm, load_reward_model
from rlhf_lit.models.scoring import (
    backbone,
    position_ids_from_mask,
    response_sequence_logprobs,
    score_head,
    sequence_scores,
    token_scores,
)

__all__ = [
    "backbone",
    "disable_dropout",
    "init_reward_head",
    "load_causal_lm",
    "load_reward_model",
    "position_ids_from_mask",
    "response_sequence_logprobs",
    "score_head",
    "sequence_scores",
    "token_scores",
]

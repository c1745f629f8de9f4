"""Reward sources other than the reward model: ``module:function`` rewards and built-in shaping.

Imports torch and the standard library only (never lightning, transformers, or rlhf_lit outside
this package), so it sits below ``stages/``. PPO's ``reward.sources``
(:mod:`rlhf_lit.stages.ppo.reward_sources`) loads each configured function with
:func:`load_reward_function`, calls it on a :class:`RewardBatch`, sums the weighted sources into the
score at the last response token and logs each one (``reward/<name>``).
"""

from rlhf_lit.rewards.functions import RewardBatch, RewardFunction, call_reward_function, load_reward_function
from rlhf_lit.rewards.shaping import length_penalty, length_target, regex_format, unfinished_penalty

__all__ = [
    "RewardBatch",
    "RewardFunction",
    "call_reward_function",
    "length_penalty",
    "length_target",
    "load_reward_function",
    "regex_format",
    "unfinished_penalty",
]

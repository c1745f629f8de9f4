"""Reward sources other than the reward model: ``module:function`` rewards and built-in shaping.

Imports torch and the standard library only (never lightning, transformers, or rlhf_lit outside
this package), so it sits below ``stages/``. Not yet wired into PPO (issue 12): the stage will
load each configured source with :func:`load_reward_function`, call it on a :class:`RewardBatch`,
sum the weighted components into the score at the last response token, and log each component.
"""

from rlhf_lit.rewards.functions import RewardBatch, RewardFunction, call_reward_function, load_reward_function
from rlhf_lit.rewards.shaping import length_penalty, length_target, regex_format

__all__ = [
    "RewardBatch",
    "RewardFunction",
    "call_reward_function",
    "length_penalty",
    "length_target",
    "load_reward_function",
    "regex_format",
]

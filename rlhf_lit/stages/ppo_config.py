"""Deprecated: the PPO settings moved to :mod:`rlhf_lit.stages.ppo.config` (PPO is a package now).

Kept one release so that code importing ``rlhf_lit.stages.ppo_config`` keeps working; importing it
warns. Import from ``rlhf_lit.stages.ppo.config`` (or ``rlhf_lit.stages.ppo``) instead.
"""

import warnings

from rlhf_lit.stages.ppo.config import KLConfig, PPOConfig, RewardConfig, RewardSource

warnings.warn(
    "rlhf_lit.stages.ppo_config is deprecated: import from rlhf_lit.stages.ppo.config", DeprecationWarning, stacklevel=2
)

__all__ = ["KLConfig", "PPOConfig", "RewardConfig", "RewardSource"]

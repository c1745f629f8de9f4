"""Deprecated, removed in 0.3.0: the PPO settings are in :mod:`rlhf_lit.stages.ppo.config`.

Code importing ``rlhf_lit.stages.ppo_config`` keeps working until then; importing it warns. Import
from ``rlhf_lit.stages.ppo.config`` (or ``rlhf_lit.stages.ppo``) instead.
"""

import warnings

from rlhf_lit.stages.ppo.config import KLConfig, PPOConfig, RewardConfig, RewardSource

warnings.warn(
    "rlhf_lit.stages.ppo_config: removed in 0.3.0; import rlhf_lit.stages.ppo.config", DeprecationWarning, stacklevel=2
)

__all__ = ["KLConfig", "PPOConfig", "RewardConfig", "RewardSource"]

"""The training stages as LightningModules: SFT and the reward model (PPO is added by its own module)."""

from rlhf_lit.stages.ppo import PPOModule
from rlhf_lit.stages.reward import RewardModule
from rlhf_lit.stages.sft import SFTModule

__all__ = ["PPOModule", "RewardModule", "SFTModule"]

"""The training stages as LightningModules: SFT, the reward model, PPO and DPO."""

from rlhf_lit.stages.dpo import DPOModule
from rlhf_lit.stages.ppo import PPOModule
from rlhf_lit.stages.reward import RewardModule
from rlhf_lit.stages.sft import SFTModule

__all__ = ["DPOModule", "PPOModule", "RewardModule", "SFTModule"]

"""The training stages as LightningModules: SFT, the reward model, PPO, DPO and BoNBoN."""

from rlhf_lit.stages.bonbon import BoNBoNModule
from rlhf_lit.stages.dpo import DPOModule
from rlhf_lit.stages.ppo import PPOModule
from rlhf_lit.stages.reward_model import RewardModelModule
from rlhf_lit.stages.sft import SFTModule

__all__ = ["BoNBoNModule", "DPOModule", "PPOModule", "RewardModelModule", "SFTModule"]

"""Lightning callbacks for the RLHF stages."""

from rlhf_lit.callbacks.checkpoint import Checkpoint, RolloutCheckpoint
from rlhf_lit.callbacks.generation import OnlineGeneration, load_judge

__all__ = ["Checkpoint", "OnlineGeneration", "RolloutCheckpoint", "load_judge"]

"""Lightning callbacks for the RLHF stages."""

from rlhf_lit.callbacks.checkpoint import Checkpoint, RolloutCheckpoint
from rlhf_lit.callbacks.guard import OverOptimisationGuard
from rlhf_lit.callbacks.online_generation import OnlineGeneration, load_judge
from rlhf_lit.callbacks.preemption import Preemption
from rlhf_lit.callbacks.progress import RunProgressBar

__all__ = [
    "Checkpoint",
    "OnlineGeneration",
    "OverOptimisationGuard",
    "Preemption",
    "RolloutCheckpoint",
    "RunProgressBar",
    "load_judge",
]

"""Hooks the SFT and reward-model stages share: non-finite steps skipped, checkpoints checked both ways.

A stage mixes :class:`GuardedStage` in before ``LightningModule`` and sets ``self.model`` (the
trained model) and ``self.nonfinite`` (a :class:`~rlhf_lit.stages.nonfinite.NonFiniteGuard`).
PPO, with manual optimization and two models, has its own versions of these hooks.
"""

from __future__ import annotations

from rlhf_lit.stages.amp import has_gradient_scaler
from rlhf_lit.stages.nonfinite import assert_finite
from rlhf_lit.stages.resume import check_module_resume


class GuardedStage:
    """Skip optimizer steps with NaN or inf gradients, never save non-finite weights, refuse a resume
    whose settings differ from the checkpoint's (except those in :attr:`SAFE_ON_RESUME`)."""

    SAFE_ON_RESUME: tuple[str, ...] = ("export_dir", "export_existing", "max_skipped_updates")
    """Settings a resume may change: where the export goes, how many skips stop the run."""

    def on_before_optimizer_step(self, optimizer) -> None:
        """Drop non-finite gradients (the step then changes nothing) and count the skip."""
        scaler = has_gradient_scaler(self.trainer)
        self.nonfinite.check_optimizer(optimizer, "the optimizer", scaler, f"step {self.global_step}")

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Refuse to save non-finite weights; keep the skip counters."""
        assert_finite(self.model, type(self).__name__)
        checkpoint["nonfinite"] = self.nonfinite.state_dict()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Check the configuration against the checkpoint's; restore the skip counters."""
        check_module_resume(self, checkpoint, self.SAFE_ON_RESUME)
        if "nonfinite" in checkpoint:
            self.nonfinite.load_state_dict(checkpoint["nonfinite"])

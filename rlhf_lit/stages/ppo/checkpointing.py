"""PPO's checkpoints: what :class:`~rlhf_lit.stages.ppo.module.PPOModule` writes beside its weights
(the rollout counter, the KL controller, the RNG state, the fingerprints of the models it reads) and
what a resume checks and restores from them."""

from __future__ import annotations

from collections.abc import MutableMapping

import torch

from rlhf_lit.sources import source_fingerprint
from rlhf_lit.stages.nonfinite import assert_finite
from rlhf_lit.stages.resume import RUN_FACTS, check_module_resume, run_facts

SAFE_ON_RESUME = (
    "max_rollouts",
    "judge",
    "judge_reads",
    "export_dir",
    "export_existing",
    "max_skipped_updates",
    "attn_implementation",  # another kernel of the same function (StageModule.SAFE_ON_RESUME)
    "cache_frozen",  # the same numbers up to float rounding (a row's trunk computed alone)
)
"""Settings a resume may change: how far the run goes, what is logged beside it, where it exports."""


def fill_whiten_scope(checkpoint: dict) -> None:
    """Give a checkpoint written before ``ppo.whiten_scope`` existed the scope it was trained with.

    Those versions whitened each process's rows: ``rank``; on one process that is the ``global``
    statistic too. So a resume compares like with like: an older single-process run continues
    under the default, an older multi-process one is refused until ``ppo.whiten_scope: rank`` is set.
    """
    ppo = checkpoint.get("hyper_parameters", {}).get("ppo")
    if isinstance(ppo, MutableMapping) and "whiten_scope" not in ppo:
        ppo["whiten_scope"] = "rank" if checkpoint.get("ppo", {}).get("world_size", 1) > 1 else "global"


class PPOCheckpoints:
    """The checkpoint hooks of :class:`~rlhf_lit.stages.ppo.module.PPOModule` (a mixin before
    :class:`~rlhf_lit.stages.base.StageModule`, whose ``drop_frozen``, ``drop_released`` and
    ``run_changes`` they use)."""

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Drop the frozen models (and after fit the released optimizer states); add the rollout counter,
        KL controller and global RNG state.

        Refuses (:class:`~rlhf_lit.stages.nonfinite.NonFiniteError`) to save non-finite weights.
        """
        assert_finite(self.policy, "the policy")
        if self.critic is not None:
            assert_finite(self.critic, "the critic")
        self.drop_frozen(checkpoint)
        self.drop_released(checkpoint)
        checkpoint[RUN_FACTS] = run_facts(self.trainer)
        checkpoint["ppo"] = {
            "rollout_index": self.rollout_index,
            "kl_controller": self.kl_ctl.state_dict(),
            # Sampling and shuffling use folded seeds, not this; kept for user code that draws from it.
            "torch_rng_state": torch.get_rng_state(),
            "nonfinite": self.nonfinite.state_dict(),
            "world_size": self.trainer.world_size,
            "sources": self._source_fingerprints(),
        }

    def _source_fingerprints(self) -> dict[str, str]:
        """The models the run reads by path, as they are on disk now (see :func:`source_fingerprint`)."""
        paths = {what: self.hparams[what] for what in ("sft_model", "reward_model", "value_model")}
        return {what: source_fingerprint(path) for what, path in paths.items() if path is not None}

    def kept_run_facts(self) -> list[str]:
        """The precision and the number of processes (also compared from ``checkpoint["ppo"]``, which
        older checkpoints hold too). ``accumulate_grad_batches`` is 1 under manual optimisation and
        ``max_steps`` is refused: the run's length is ``max_rollouts``, a hyperparameter."""
        return ["trainer.precision", "trainer.world_size"]

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Check the configuration, Trainer settings and run seed against the checkpoint's
        (:mod:`rlhf_lit.stages.resume`) and restore the PPO state. The frozen models are not in
        checkpoints (:meth:`load_state_dict`)."""
        ppo_state = checkpoint["ppo"]
        extra = self.run_changes(checkpoint)
        if self._trainer is not None:
            extra["trainer.world_size"] = (
                ppo_state.get("world_size", self.trainer.world_size),
                self.trainer.world_size,
            )
        now = self._source_fingerprints()
        for what, saved in ppo_state.get("sources", {}).items():  # a model directory replaced in place
            extra[f"model.{what} (its files)"] = (saved, now.get(what))
        safe = SAFE_ON_RESUME
        schedules = (self.optimizer_cfg, self.critic_optimizer_cfg or self.optimizer_cfg)
        if any(cfg.schedule != "constant" for cfg in schedules):
            safe = tuple(k for k in safe if k != "max_rollouts")  # it is the decaying schedule's length
        fill_whiten_scope(checkpoint)
        check_module_resume(self, checkpoint, safe, extra)
        self.rollout_index = int(ppo_state["rollout_index"])
        if "nonfinite" in ppo_state:
            self.nonfinite.load_state_dict(ppo_state["nonfinite"])
        self.kl_ctl.load_state_dict(ppo_state["kl_controller"])
        torch.set_rng_state(ppo_state["torch_rng_state"])

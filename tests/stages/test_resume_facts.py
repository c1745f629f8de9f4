"""What a resume compares besides the hyperparameters: Trainer settings and the run seed (rlhf_lit.stages.resume)."""

from __future__ import annotations

import pytest

from rlhf_lit.stages.resume import run_fact_changes

SAVED = {
    "trainer.precision": "32-true",
    "trainer.accumulate_grad_batches": 1,
    "trainer.world_size": 1,
    "trainer.max_steps": 4,
    "trainer.max_epochs": -1,
    "seed_everything": 11,
}
NOW = {**SAVED, "trainer.precision": "bf16-mixed", "trainer.max_steps": 6, "seed_everything": 12}
KEPT = ["trainer.precision", "trainer.accumulate_grad_batches", "trainer.world_size"]


def test_only_the_kept_settings_are_refused_and_the_others_logged(caplog):
    caplog.set_level("INFO", logger="rlhf_lit")
    assert run_fact_changes(SAVED, NOW, KEPT, seeds_following=[]) == {"trainer.precision": ("32-true", "bf16-mixed")}
    assert "resuming with trainer.max_steps changed: 4 -> 6" in caplog.text  # a constant schedule: only the length
    assert "resuming with seed_everything changed: 11 -> 12" in caplog.text  # every seed set explicitly
    both = run_fact_changes(SAVED, NOW, KEPT + ["trainer.max_steps"], seeds_following=[])
    assert both == {"trainer.max_steps": (4, 6), "trainer.precision": ("32-true", "bf16-mixed")}


def test_the_run_seed_must_match_when_a_seed_option_follows_it():
    changes = run_fact_changes(SAVED, NOW, [], seeds_following=["data.seed"])
    assert changes == {"seed_everything (data.seed follows it)": (11, 12)}
    changes = run_fact_changes(SAVED, NOW, [], seeds_following=["model.rollout_seed", "data.seed"])
    assert changes == {"seed_everything (model.rollout_seed and data.seed follow it)": (11, 12)}


def test_a_checkpoint_written_before_the_facts_were_recorded_is_not_checked_for_them():
    assert run_fact_changes({}, NOW, KEPT + ["trainer.max_steps"], seeds_following=["data.seed"]) == {}


def test_a_setting_newer_than_the_checkpoint_counts_as_unchanged_only_at_its_default():
    # A reward-model checkpoint written before length_debias existed resumes with it off, not with it on.
    from rlhf_lit.stages import RewardModelModule
    from rlhf_lit.stages.resume import ResumeMismatch, check_resume, init_defaults

    defaults = init_defaults(RewardModelModule)
    assert defaults["length_debias"] == {"method": "none", "correlation_weight": 1.0, "orthogonality_weight": 1.0}
    saved = {"hyper_parameters": {"normalize": "bias"}}
    off = {"normalize": "bias", "length_debias": defaults["length_debias"]}
    check_resume(saved, off, None, safe_model_keys=[], model_defaults=defaults)
    on = {"normalize": "bias", "length_debias": {**defaults["length_debias"], "method": "odin"}}
    with pytest.raises(ResumeMismatch, match=r"model.length_debias.method: checkpoint \(not set\), now 'odin'"):
        check_resume(saved, on, None, safe_model_keys=[], model_defaults=defaults)
    with pytest.raises(ResumeMismatch, match="model.length_debias.method"):  # without defaults: refused as before
        check_resume(saved, off, None, safe_model_keys=[])

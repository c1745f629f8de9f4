"""cache_frozen on the reward-model and DPO stages: a run ends where the plain run ends (float32 rounding
of rows computed alone), reads every row after its first pass from the store (DPO's reference reads the
policy's rows: one store for both), resumes bit for bit, and is refused without trainable_layers."""

from __future__ import annotations

import pytest
import torch
from cache_helpers import statistics_per_epoch
from lightning.pytorch.callbacks import ModelCheckpoint

from rlhf_lit.stages import DPOModule, RewardModelModule
from rlhf_lit.stages.optim import OptimizerConfig

# Adam with eps 1 moves a weight by about lr x its gradient: float32 rounding of the trunk (rows computed
# alone) stays rounding, where Adam's usual eps would turn a near-zero gradient's rounding into a step of lr.
OPT = OptimizerConfig(lr=0.3, eps=1.0)
PAIRS = [
    ("Tom went", " to the park. He was happy.", " to the park. He was sad."),
    ("Lily", " sang a song.", " cried."),
    ("The dog", " ran and played with the ball.", " slept."),
    ("Sue had", " a red hat.", " a cold and a very bad day."),
]


def _data(helpers, tokenizer):
    batches = [helpers.preference_batch(tokenizer, PAIRS[:2]), helpers.preference_batch(tokenizer, PAIRS[2:])]
    return helpers.BatchListDataModule(train=batches, val=batches[:1])


def _reward_model(stories_path, export_dir, cache: bool) -> RewardModelModule:
    torch.manual_seed(0)  # the score head's initialisation
    return RewardModelModule(
        stories_path,
        optimizer=OPT,
        normalize="none",
        trainable_layers=2,
        cache_frozen=cache,
        export_dir=str(export_dir),
    )


def test_a_cached_reward_model_ends_where_the_plain_one_ends(stories_path, helpers, tmp_path):
    runs = {}
    for cache in (False, True):
        module = _reward_model(stories_path, tmp_path / f"export-{cache}", cache)
        start = module.model.score.weight.detach().clone()
        trainer = helpers.cpu_trainer(tmp_path / str(cache), max_steps=6, limit_val_batches=1)
        if cache:
            seen = statistics_per_epoch(module)
        trainer.fit(module, datamodule=_data(helpers, module.tokenizer))
        runs[cache] = module
    # 3 epochs of 2 batches of 4 rows, the first batch validated each epoch: the 8 rows computed before
    # the first step (prefill), every pass a read (the probe's 2 rows apart)
    assert seen[-1]["prefilled"] == 8 and seen[-1]["misses"] == 2 and seen[-1]["hits"] == 3 * 8 + 3 * 4
    assert not runs[True].trunk_caches.attachments  # fit's end took the hooks off
    assert (runs[True].model.score.weight - start).abs().max() > 1e-3  # it trained
    for (name, got), want in zip(runs[True].model.named_parameters(), runs[False].model.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=name)


def test_a_cached_reward_model_resumes_exactly(stories_path, helpers, tmp_path):
    """Stopped after epoch 0 of 3 and resumed with an empty store: the rows it computes again are the
    values the uninterrupted run read, so the weights end equal bit for bit."""
    whole = _reward_model(stories_path, tmp_path / "whole-export", True)
    helpers.cpu_trainer(tmp_path / "whole", max_steps=6).fit(whole, datamodule=_data(helpers, whole.tokenizer))
    first = _reward_model(stories_path, tmp_path / "first-export", True)
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
    helpers.cpu_trainer(tmp_path / "first", max_steps=2, enable_checkpointing=True, callbacks=[saver]).fit(
        first, datamodule=_data(helpers, first.tokenizer)
    )
    (after_epoch_0,) = (tmp_path / "ckpt").glob("*.ckpt")
    resumed = _reward_model(stories_path, tmp_path / "resumed-export", True)
    trainer = helpers.cpu_trainer(tmp_path / "resumed", max_steps=6)
    trainer.fit(resumed, datamodule=_data(helpers, resumed.tokenizer), ckpt_path=after_epoch_0)
    assert trainer.global_step == 6
    for (name, got), want in zip(resumed.model.named_parameters(), whole.model.parameters()):
        assert torch.equal(got, want), name


def test_dpo_reads_the_reference_from_the_policys_store(stories_path, helpers, tmp_path):
    runs = {}
    for cache in (False, True):
        module = DPOModule(
            stories_path, optimizer=OPT, trainable_layers=2, cache_frozen=cache, export_dir=str(tmp_path / str(cache))
        )
        if cache:
            assert len(module.trunk_caches.stores) == 1 and len(module.trunk_caches.attachments) == 2
            seen = statistics_per_epoch(module)
        helpers.cpu_trainer(tmp_path / str(cache), max_steps=2).fit(module, datamodule=_data(helpers, module.tokenizer))
        runs[cache] = module
    # one epoch of 8 rows computed before the first step (prefill), read by the policy and the reference,
    # then the validation batch's 4 rows, read by both (each model's probe: 2 rows apart)
    assert seen[-1]["prefilled"] == 8 and seen[-1]["misses"] == 2 * 2 and seen[-1]["hits"] == 2 * 8 + 2 * 4
    for (name, got), want in zip(runs[True].model.named_parameters(), runs[False].model.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=name)


def test_cache_frozen_needs_trainable_layers(stories_path):
    with pytest.raises(ValueError, match="cache_frozen keeps the output of the blocks below trainable_layers"):
        RewardModelModule(stories_path, cache_frozen=True)


def test_a_cached_reward_model_resumed_mid_epoch_on_real_data_is_exact(stories_path, helpers, tmp_path):
    """PreferenceDataModule's sampler skips what was trained after a resume; the rows kept before the first
    step are read from its dataset in index order, so a run resumed mid-epoch 1 (rows of epoch 0 kept by
    the first run, computed again by the resumed one) ends bit for bit where the uninterrupted run ends."""
    from assets_paths import HH_RLHF

    from rlhf_lit.data import PreferenceDataModule

    def data(tok):
        return PreferenceDataModule(
            tokenizer=tok, train_path=str(HH_RLHF), format="hh_rlhf", max_records=12, batch_size=4,
            max_length=64, max_prompt_length=32, seed=3,
        )  # fmt: skip

    whole = _reward_model(stories_path, tmp_path / "whole-export", True)
    counts = {"whole": statistics_per_epoch(whole)}
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1)
    trainer = helpers.cpu_trainer(tmp_path / "whole", max_steps=6, enable_checkpointing=True, callbacks=[saver])
    trainer.fit(whole, datamodule=data(whole.tokenizer))  # 3 batches an epoch
    (mid_epoch_1,) = (tmp_path / "ckpt").glob("*step=4.ckpt")
    resumed = _reward_model(stories_path, tmp_path / "resumed-export", True)
    counts["resumed"] = statistics_per_epoch(resumed)
    trainer = helpers.cpu_trainer(tmp_path / "resumed", max_steps=6)
    trainer.fit(resumed, datamodule=data(resumed.tokenizer), ckpt_path=mid_epoch_1)
    assert trainer.global_step == 6
    # Both runs kept every row before their first step, and no pass computed one (beside the probe's 2):
    # the values read do not depend on the sampler's position (on a model this small a row computed in
    # another batch may give the same bits, so the counts, not only the weights, are checked).
    for seen in counts.values():
        assert seen[-1]["prefilled"] == counts["whole"][-1]["prefilled"] > 0 and seen[-1]["misses"] == 2
    for (name, got), want in zip(resumed.model.named_parameters(), whole.model.parameters()):
        assert torch.equal(got, want), name

"""SFT, the reward model and DPO with trainable_layers: the frozen part never changes or gets a
gradient, the top block and the head do train, and LoRA beside it is refused."""

from __future__ import annotations

import pytest
import torch

from rlhf_lit.models.lora import LoRAConfig
from rlhf_lit.stages import DPOModule, RewardModelModule, SFTModule
from rlhf_lit.stages.optim import OptimizerConfig

FAST = OptimizerConfig(lr=3e-3)
PAIRS = [("Tom went", " to the park. He was happy.", " to the park. He was sad."), ("Lily", " sang.", " cried.")]


def _fit(module, batch, helpers, tmp_path):
    frozen = {n: p.detach().clone() for n, p in module.model.named_parameters() if not p.requires_grad}
    top = {n: p.detach().clone() for n, p in module.model.named_parameters() if ".layers.4." in n}
    assert frozen and top and not any(".layers.4." in n for n in frozen)
    helpers.cpu_trainer(tmp_path, max_steps=2).fit(
        module, datamodule=helpers.BatchListDataModule(train=[batch], val=[batch])
    )
    params = dict(module.model.named_parameters())
    for name, before in frozen.items():
        assert params[name].grad is None and torch.equal(params[name], before), name
    assert any(not torch.equal(params[n], before) for n, before in top.items())


def test_sft_trains_only_its_top_block(stories_path, helpers, tmp_path):
    module = SFTModule(stories_path, optimizer=FAST, trainable_layers=1, export_dir=str(tmp_path / "x"))
    _fit(module, helpers.sft_batch(module.tokenizer, [("Tom went", " to the park.")]), helpers, tmp_path)


def test_reward_model_trains_only_its_top_block_and_head(stories_path, helpers, tmp_path):
    module = RewardModelModule(stories_path, optimizer=FAST, trainable_layers=1, export_dir=str(tmp_path / "x"))
    head = module.model.score.weight.detach().clone()
    _fit(module, helpers.preference_batch(module.tokenizer, PAIRS), helpers, tmp_path)
    assert not torch.equal(module.model.score.weight, head)


def test_dpo_trains_only_its_top_block(stories_path, helpers, tmp_path):
    module = DPOModule(stories_path, optimizer=FAST, trainable_layers=1, export_dir=str(tmp_path / "x"))
    _fit(module, helpers.preference_batch(module.tokenizer, PAIRS), helpers, tmp_path)


def test_trainable_layers_beside_lora_is_refused(stories_path):
    with pytest.raises(ValueError, match="trainable_layers and lora both choose what trains"):
        SFTModule(stories_path, trainable_layers=1, lora=LoRAConfig(r=4))

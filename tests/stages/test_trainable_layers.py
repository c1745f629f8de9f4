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


def test_frozen_modules_stay_as_they_were_beside_trainable_layers(stories_path, helpers, tmp_path):
    # the reward model's top block trains but for its MLP, and DPO's whole top but for the top MLP
    for module in (
        RewardModelModule(
            stories_path, optimizer=FAST, trainable_layers=1, frozen_modules=["mlp"], export_dir=str(tmp_path / "r")
        ),
        DPOModule(
            stories_path,
            optimizer=FAST,
            trainable_layers=2,
            frozen_modules=["layers.4.mlp"],
            export_dir=str(tmp_path / "d"),
        ),
    ):
        mlp = {n: p.detach().clone() for n, p in module.model.named_parameters() if n.startswith("model.layers.4.mlp.")}
        attention = {n: p.detach().clone() for n, p in module.model.named_parameters() if ".layers.4.self_attn." in n}
        assert mlp and not any(module.model.get_parameter(n).requires_grad for n in mlp)
        batch = helpers.preference_batch(module.tokenizer, PAIRS)
        helpers.cpu_trainer(tmp_path, max_steps=2).fit(
            module, datamodule=helpers.BatchListDataModule(train=[batch], val=[batch])
        )
        for name, before in mlp.items():
            p = module.model.get_parameter(name)
            assert p.grad is None and torch.equal(p, before), name
        assert any(not torch.equal(module.model.get_parameter(n), before) for n, before in attention.items())


def test_frozen_modules_beside_lora_is_refused(stories_path):
    with pytest.raises(ValueError, match="frozen_modules and lora both choose what trains"):
        SFTModule(stories_path, frozen_modules=["mlp"], lora=LoRAConfig(r=4))

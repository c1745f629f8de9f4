"""PPO with trainable_layers: the frozen part of the policy and of the separate critic never changes and
never gets a gradient, the optimizers hold state only for what trains, and a run resumes exactly."""

from __future__ import annotations

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from ppo_helpers import TINYSTORIES, assert_resumes_exactly, tiny_module, tiny_trainer

from rlhf_lit.data import PromptDataModule
from rlhf_lit.stages.optim import OptimizerConfig

FAST = OptimizerConfig(lr=3e-3, eps=1e-5)  # large, so that what trains moves visibly in 2 rollouts


def _data(module):
    return PromptDataModule(
        tokenizer=module.tokenizer, train_path=TINYSTORIES, format="paragraphs", max_records=16, batch_size=4, seed=3
    )


def _frozen(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}


def test_only_the_top_blocks_of_policy_and_critic_train(tmp_path):
    module = tiny_module(trainable_layers=2, max_rollouts=2, optimizer=FAST)
    frozen = {"policy": _frozen(module.policy), "critic": _frozen(module.critic)}
    # stories260K: 5 blocks, so blocks 0-2 and the (tied) embeddings are frozen in both models
    assert any(".layers.2." in n for n in frozen["policy"]) and any(".layers.2." in n for n in frozen["critic"])
    assert not any(".layers.3." in n for n in frozen["policy"]) and "model.embed_tokens.weight" in frozen["policy"]
    assert not any("score" in n for n in frozen["critic"])
    before = {n: p.detach().clone() for n, p in module.policy.named_parameters()}
    tiny_trainer(tmp_path).fit(module, _data(module))
    for which, model in (("policy", module.policy), ("critic", module.critic)):
        for name, p in model.named_parameters():
            if name in frozen[which]:
                assert p.grad is None and torch.equal(p, frozen[which][name]), f"{which} {name}"
    assert not torch.equal(
        module.policy.model.layers[4].mlp.up_proj.weight, before["model.layers.4.mlp.up_proj.weight"]
    )
    trained = {id(p) for m in module.trained_models for p in m.parameters() if p.requires_grad}
    for opt in module.optimizers():
        assert {id(p) for p in opt.optimizer.state} <= trained  # no Adam state for a frozen weight


def test_ppo_with_trainable_layers_resumes_exactly(tmp_path):
    steps_per_rollout = 8  # 2 epochs x 2 minibatches x 2 optimizers
    kwargs = dict(trainable_layers=2, max_rollouts=3, optimizer=FAST)
    straight = tiny_module(**kwargs)
    ckpt = ModelCheckpoint(
        dirpath=tmp_path / "ckpt", every_n_train_steps=steps_per_rollout, save_top_k=-1, filename="{step}"
    )
    tiny_trainer(tmp_path, enable_checkpointing=True, callbacks=[ckpt]).fit(straight, _data(straight))
    resumed = tiny_module(**kwargs)
    assert_resumes_exactly(straight, resumed, _data(resumed), tmp_path, f"step={steps_per_rollout}.ckpt")

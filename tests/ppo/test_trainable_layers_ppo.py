"""PPO with trainable_layers: the frozen part of the policy and of the separate critic never changes and
never gets a gradient, the optimizers hold state only for what trains, and a run resumes exactly; the
policy's frozen_modules stay as they were while the critic's same modules train."""

from __future__ import annotations

import pytest
import torch
from cache_helpers import statistics_per_epoch
from lightning.pytorch.callbacks import ModelCheckpoint
from ppo_helpers import TINYSTORIES, assert_resumes_exactly, tiny_module, tiny_trainer

from rlhf_lit.data import PromptDataModule
from rlhf_lit.stages.optim import OptimizerConfig
from rlhf_lit.stages.ppo import PPOConfig

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


def test_frozen_modules_of_the_policy_never_change_the_critics_train(tmp_path):
    module = tiny_module(trainable_layers=2, frozen_modules=["layers.4.mlp"], max_rollouts=2, optimizer=FAST)
    mlp = {
        which: {n: p.detach().clone() for n, p in model.named_parameters() if ".layers.4.mlp." in n}
        for which, model in (("policy", module.policy), ("critic", module.critic))
    }
    assert mlp["policy"] and not any(p.requires_grad for n, p in module.policy.named_parameters() if n in mlp["policy"])
    attention = module.policy.model.layers[4].self_attn.q_proj.weight.detach().clone()
    tiny_trainer(tmp_path).fit(module, _data(module))
    policy = dict(module.policy.named_parameters())
    for name, before in mlp["policy"].items():
        assert policy[name].grad is None and torch.equal(policy[name], before), name
    assert not torch.equal(module.policy.model.layers[4].self_attn.q_proj.weight, attention)
    critic = dict(module.critic.named_parameters())
    assert any(not torch.equal(critic[n], before) for n, before in mlp["critic"].items())


@pytest.mark.parametrize(
    "cache_frozen, frozen_modules",
    [(False, None), (True, None), (True, ["layers.4.mlp"])],
    ids=["plain", "cache_frozen", "frozen_top_mlp"],
)
def test_ppo_with_trainable_layers_resumes_exactly(tmp_path, cache_frozen, frozen_modules):
    steps_per_rollout = 8  # 2 epochs x 2 minibatches x 2 optimizers
    kwargs = dict(
        trainable_layers=2, max_rollouts=3, optimizer=FAST, cache_frozen=cache_frozen, frozen_modules=frozen_modules
    )
    straight = tiny_module(**kwargs)
    ckpt = ModelCheckpoint(
        dirpath=tmp_path / "ckpt", every_n_train_steps=steps_per_rollout, save_top_k=-1, filename="{step}"
    )
    tiny_trainer(tmp_path, enable_checkpointing=True, callbacks=[ckpt]).fit(straight, _data(straight))
    resumed = tiny_module(**kwargs)
    assert_resumes_exactly(straight, resumed, _data(resumed), tmp_path, f"step={steps_per_rollout}.ckpt")


def test_cache_frozen_gives_the_plain_update_and_one_store_for_every_model(tmp_path):
    # Adam with eps 1 moves a weight by about lr x its gradient, so the float32 rounding of rows computed
    # alone stays rounding (the usual eps would turn a near-zero gradient's rounding into a step of lr).
    smooth = OptimizerConfig(lr=0.3, eps=1.0)
    runs = {}
    for cache in (False, True):
        module = tiny_module(trainable_layers=2, max_rollouts=1, optimizer=smooth, cache_frozen=cache)
        if cache:  # policy, critic, reference and reward model: all stories260K below their top 2 blocks
            assert len(module.trunk_caches.attachments) == 4 and len(module.trunk_caches.stores) == 1
            seen = statistics_per_epoch(module)
        tiny_trainer(tmp_path / str(cache)).fit(module, _data(module))
        runs[cache] = module
    # the rollout's 4 rows computed once (beside each model's 2-row probe), then read by the reference,
    # the critic and the reward model, and again in the update's 2 epochs
    assert seen[-1]["misses"] == 4 * 2 + 4 and seen[-1]["hits"] >= 3 * 4 + 2 * 4
    for which in ("policy", "critic"):
        cached, plain = getattr(runs[True], which), getattr(runs[False], which)
        for (name, got), want in zip(cached.named_parameters(), plain.parameters()):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f"{which} {name}")


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({}, "cache_frozen keeps the output of the blocks below trainable_layers; set trainable_layers"),
        ({"trainable_layers": 2, "ppo": PPOConfig(forward="compiled")}, "cache_frozen reads its rows in eager passes"),
    ],
)
def test_cache_frozen_refusals(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_module(cache_frozen=True, **overrides)

"""Non-finite values in PPO: each optimizer's skips are counted apart, skipped steps change nothing."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from ppo_helpers import prompt_batch, tiny_module, tiny_trainer
from torch.utils.data import DataLoader

from rlhf_lit.stages.nonfinite import NonFiniteError
from rlhf_lit.stages.ppo.config import PPOConfig

PROMPTS = ["Once upon a time", "The", "Tom had a red", "A big dog"]


def test_a_critic_with_nan_gradients_at_every_step_stops_the_run_while_the_policy_trains(tmp_path):
    # Policy and critic step in turn; a counter reset by the policy's good steps would never trip.
    module = tiny_module(max_rollouts=5, ppo=PPOConfig(epochs=2, minibatch_size=2))  # 4 steps a rollout
    critic_before = {k: v.clone() for k, v in module.critic.state_dict().items()}
    policy_before = {k: v.clone() for k, v in module.policy.state_dict().items()}
    next(module.critic.parameters()).register_hook(lambda grad: torch.full_like(grad, float("nan")))
    trainer = tiny_trainer(tmp_path)
    with pytest.raises(
        NonFiniteError, match=r"3 updates in a row skipped .*non-finite gradients of the critic at rollout 0"
    ):
        trainer.fit(module, DataLoader([prompt_batch(module.tokenizer, PROMPTS)] * 5, batch_size=None))
    for key, value in module.critic.state_dict().items():
        assert torch.equal(value, critic_before[key]), key  # dropped gradients: AdamW moved nothing
    assert any(not torch.equal(v, policy_before[k]) for k, v in module.policy.state_dict().items())
    assert module.nonfinite.consecutive == {"the policy": 0, "the critic": 3}


def test_under_fp16_a_nan_loss_stops_the_run_as_in_32_bit(tmp_path):
    # The GradScaler skips every step (NaN gradients) by itself; the guard counts them, each optimizer apart.
    module = tiny_module(max_rollouts=5, ppo=PPOConfig(epochs=2, minibatch_size=2))
    before = {k: v.clone() for k, v in module.state_dict().items()}
    loss = module.minibatch_loss

    def nan_loss(mb, *args):
        value, stats = loss(mb, *args)
        return value * float("nan"), stats

    module.minibatch_loss = nan_loss
    scaler = torch.amp.GradScaler("cpu")  # Lightning makes 16-mixed bf16 on a CPU: the fp16 plugin, as CUDA gets it
    trainer = tiny_trainer(tmp_path, plugins=[MixedPrecision("16-mixed", device="cpu", scaler=scaler)])
    with pytest.raises(
        NonFiniteError,
        match=r"3 updates in a row skipped .*non-finite gradients of the policy at "
        r"rollout 0.*skipped by the fp16 GradScaler.*the loss was not finite",
    ):
        trainer.fit(module, DataLoader([prompt_batch(module.tokenizer, PROMPTS)] * 5, batch_size=None))
    for key, value in module.state_dict().items():
        assert torch.equal(value, before[key]), key  # the scaler skipped every step
    assert module.nonfinite.consecutive == {"the policy": 3, "the critic": 2}

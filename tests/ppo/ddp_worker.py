"""A tiny PPO fit under DDP on 2 CPU processes (gloo), read by tests/ppo/test_ddp.py.

:func:`main` is two parts of the suite's two-process launch (two_process_worker.py). Every rank
sees the SAME prompts (no distributed sampler). The run is REINFORCE++ with reward whitening, so
two whitenings per rollout are taken over the rows of both ranks. Each rank writes to
``<out>/rank<r>.pt`` what it sampled in the first rollout, what its KL controller was fed, each
rollout's rewards before and after whitening, returns, advantages, raw scores and response mask,
the data positions it reported, the metrics it logged, and its final policy parameters. A second
argument ``compiled`` runs the scoring and update passes compiled (``ppo.forward``); a third names
the model (policy, reference, critic and reward model), stories260K unless given.
"""

from __future__ import annotations

import torch
from lightning.pytorch import LightningDataModule
from ppo_helpers import STORIES, prompt_batch, tiny_module, tiny_trainer
from torch.utils.data import DataLoader

import rlhf_lit.stages.ppo.experience as experience
from rlhf_lit.stages.ppo.config import PPOConfig, RewardConfig

ROLLOUT_FIELDS = (
    "rewards",
    "returns",
    "advantages",
    "raw_scores",
    "response_mask",
    "query_responses",
    "attention_mask",
    "old_logprobs",
    "kl",
)


class SamePrompts(LightningDataModule):
    """The same left-padded prompt batch, three times, on every rank; records ``mark_consumed``."""

    def __init__(self, tokenizer) -> None:
        super().__init__()
        self.batch = prompt_batch(tokenizer, ["Once upon a time", "Tom had a red", "The cat", "A big dog"])
        self.consumed: list[int] = []

    def train_dataloader(self):
        # batch_size=None: each item already is a batch (a bare list would read as 3 loaders).
        return DataLoader([self.batch] * 3, batch_size=None)

    def mark_consumed(self, n: int) -> None:
        self.consumed.append(n)


def main(out: str, forward: str = "eager", model: str = STORIES) -> None:
    torch.set_num_threads(1)
    ppo = PPOConfig(epochs=2, minibatch_size=2, estimator="reinforce_pp", forward=forward)
    module = tiny_module(
        sft_model=model, reward_model=model, max_rollouts=3, ppo=ppo, reward=RewardConfig(whiten="rewards")
    )
    sampled, shaped, rollouts = [], [], []
    generate = module.generate

    def recording_generate(batch):
        gen = generate(batch)
        sampled.append(gen.response_ids.clone())
        return gen

    module.generate = recording_generate
    kl_penalized_rewards = experience.kl_penalized_rewards

    def recording_rewards(*args, **kwargs):  # the per-token rewards before reward whitening
        rewards, kl = kl_penalized_rewards(*args, **kwargs)
        shaped.append(rewards.clone())
        return rewards, kl

    experience.kl_penalized_rewards = recording_rewards  # put back after the fit (the launch goes on)
    # What the KL controller is fed, and this rank's own KL per response, every rollout.
    controller, local_kl = [], []
    update = module.kl_ctl.update

    def recording_update(current_kl, n_steps):
        controller.append((float(current_kl), n_steps, module.kl_ctl.value))
        update(current_kl, n_steps)

    module.kl_ctl.update = recording_update
    make_rollout = module.make_rollout

    def recording_make_rollout(batch, timer, *args):
        rollout, entropy = make_rollout(batch, timer, *args)
        local_kl.append(float(rollout.kl.sum(1).mean()))  # summed over tokens, mean over this rank's rows
        rollouts.append({k: getattr(rollout, k).clone() for k in ROLLOUT_FIELDS})
        return rollout, entropy

    module.make_rollout = recording_make_rollout
    data = SamePrompts(module.tokenizer)
    trainer = tiny_trainer(out, strategy="ddp", devices=2, use_distributed_sampler=False)
    try:
        trainer.fit(module, datamodule=data)
    finally:
        experience.kl_penalized_rewards = kl_penalized_rewards
    torch.save(
        {
            "first_responses": sampled[0],
            "kl_coef": module.kl_ctl.value,
            "controller": controller,
            "local_kl": local_kl,
            "rollouts": module.rollout_index,
            "shaped_rewards": shaped,
            "rollout": rollouts,
            "consumed": data.consumed,
            "logged": trainer.logger.history,
            "policy": {k: v.detach().clone() for k, v in module.policy.state_dict().items()},
            "initial": {k: v for k, v in tiny_module(sft_model=model, reward_model=model).policy.state_dict().items()},
            "compile_graphs": module.forward_passes.stats.graphs,
        },
        f"{out}/rank{trainer.global_rank}.pt",
    )

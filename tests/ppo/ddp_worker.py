"""Run by tests/ppo/test_ddp.py: a tiny PPO fit under DDP on 2 CPU processes (gloo).

Lightning's subprocess launcher re-runs this file for rank 1, so it must be a script. Every rank
sees the SAME prompts (no distributed sampler) and writes what it sampled in the first rollout,
its final KL coefficient and its final policy parameters to ``<out>/rank<r>.pt``.
"""

from __future__ import annotations

import sys

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader
from ppo_helpers import prompt_batch, tiny_module, tiny_trainer


class SamePrompts(LightningDataModule):
    """The same left-padded prompt batch, three times, on every rank."""

    def __init__(self, tokenizer) -> None:
        super().__init__()
        self.batch = prompt_batch(tokenizer, ["Once upon a time", "Tom had a red", "The cat", "A big dog"])

    def train_dataloader(self):
        # batch_size=None: each item already is a batch (a bare list would read as 3 loaders).
        return DataLoader([self.batch] * 3, batch_size=None)


def main(out: str) -> None:
    torch.set_num_threads(1)
    module = tiny_module(max_rollouts=3)
    sampled = []
    generate = module.generate

    def recording_generate(batch):
        gen = generate(batch)
        sampled.append(gen.response_ids.clone())
        return gen

    module.generate = recording_generate
    # What the KL controller is fed, and this rank's own KL per response, every rollout.
    controller, local_kl = [], []
    update = module.kl_ctl.update

    def recording_update(current_kl, n_steps):
        controller.append((float(current_kl), n_steps, module.kl_ctl.value))
        update(current_kl, n_steps)

    module.kl_ctl.update = recording_update
    make_rollout = module.make_rollout

    def recording_make_rollout(batch, timer):
        rollout, entropy = make_rollout(batch, timer)
        local_kl.append(float(rollout.kl.sum(1).mean()))  # summed over tokens, mean over this rank's rows
        return rollout, entropy

    module.make_rollout = recording_make_rollout
    trainer = tiny_trainer(out, strategy="ddp", devices=2, use_distributed_sampler=False)
    trainer.fit(module, datamodule=SamePrompts(module.tokenizer))
    torch.save(
        {
            "first_responses": sampled[0],
            "kl_coef": module.kl_ctl.value,
            "controller": controller,
            "local_kl": local_kl,
            "rollouts": module.rollout_index,
            "policy": {k: v.detach().clone() for k, v in module.policy.state_dict().items()},
            "initial": {k: v for k, v in tiny_module().policy.state_dict().items()},
        },
        f"{out}/rank{trainer.global_rank}.pt",
    )


if __name__ == "__main__":
    main(sys.argv[1])

"""One GRPO rollout (k = 2 samples per prompt) under DDP on 2 CPU processes, read by tests/ppo/test_groups_ddp.py
(a part of the suite's two-process launch, two_process_worker.py).

Rank r gets prompts [2r, 2r + 1] of four; each rank repeats its own prompts k times, so a group never
spans ranks. Each rank writes its rollout's prompt tokens, raw scores and advantages, and the data
positions it reported, to ``rank<r>.pt``.
"""

from __future__ import annotations

import torch
from ppo_helpers import prompt_batch, tiny_module, tiny_trainer
from strategy_worker import RankPrompts

from rlhf_lit.models.generation import SamplingConfig
from rlhf_lit.stages.ppo.config import PPOConfig

PROMPTS = ["Once upon a time", "Tom had a red", "The cat", "A big dog"]


def main(out: str) -> None:
    torch.set_num_threads(1)
    module = tiny_module(
        ppo=PPOConfig(epochs=1, minibatch_size=4, estimator="grpo"),
        sampling=SamplingConfig(max_new_tokens=6, samples_per_prompt=2),
        max_rollouts=1,
    )
    rollouts = []
    make_rollout = module.make_rollout
    module.make_rollout = lambda batch, timer, *args: rollouts.append(make_rollout(batch, timer, *args)) or rollouts[-1]
    batch = prompt_batch(module.tokenizer, PROMPTS)
    trainer = tiny_trainer(out, strategy="ddp", devices=2, use_distributed_sampler=False)
    data = RankPrompts(batch, torch.arange(4), 2)
    trainer.fit(module, datamodule=data)
    rollout = rollouts[0][0]
    prompt_length = rollout.query_responses.shape[1] - rollout.response_ids.shape[1]
    torch.save(
        {
            "prompts": rollout.query_responses[:, :prompt_length],
            "prompt_mask": rollout.attention_mask[:, :prompt_length],
            "scores": rollout.scores,
            "advantages": rollout.advantages,
            "mask": rollout.response_mask,
            "batch": batch,
            "consumed": data.consumed,
        },
        f"{out}/rank{trainer.global_rank}.pt",
    )

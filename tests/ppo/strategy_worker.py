"""One greedy PPO rollout and update, on 1 process or 2 (ddp / fsdp2), read by tests/ppo/test_strategies.py.

``main(OUT, MODE)``, four parts of the suite's two-process launch (two_process_worker.py), with MODE
``single`` (1 process, all 8 prompts), ``ddp`` or ``fsdp2`` (2 CPU processes, gloo, 4 prompts each:
rank 0 the prompts whose greedy responses end soonest, rank 1 the rest, so the ranks stop generating at different lengths and hold different
numbers of response tokens). Greedy decoding makes the responses a function of the prompts alone,
so the 2-process runs see exactly the single run's global batch. Scores and advantages are
whitened (over all processes: ``ppo.whiten_scope``'s default). Each rank writes ``rank<r>.pt``: its
responses, its rollout's raw and whitened scores and advantages, every minibatch's local losses and
token count, every optimizer step's (reduced, gathered) gradients, the final policy (gathered) and
the size of its own policy shards; rank 0 also exports the policy.

``main(OUT, "ddp", "compiled")`` decodes with ``sampling.decode: compiled`` and also records, in the same process, the eager path's responses to the same prompts (``eager_responses``),
what compiling cost in this run (``compile_stats``: the process's totals after the run less
those before) and the rollout's logged metrics (``metrics``).
"""

from __future__ import annotations

import dataclasses

import torch
from lightning.pytorch import LightningDataModule
from ppo_helpers import prompt_batch, tiny_module, tiny_trainer
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader

import rlhf_lit.strategies  # noqa: F401  (registers fsdp2)
from rlhf_lit.models.compiled_generation import compile_stats
from rlhf_lit.models.generation import SamplingConfig, generate_responses
from rlhf_lit.models.sharding import full_state_dict
from rlhf_lit.stages.ppo.config import KLConfig, PPOConfig, RewardConfig

PROMPTS = ["Tom had a red", "Lily saw a", "Ben was", "Anna", "Once upon a time", "The cat", "A big dog", "Sam and Mia"]
"""Greedy responses (with "." as a stop) of 3, 5, 8, 8 tokens, then four of the full 10."""


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


class RankPrompts(LightningDataModule):
    """One batch: all prompts (1 process) or this rank's part of them, padded as one global batch;
    records the data positions PPO reports (``mark_consumed``)."""

    def __init__(self, batch: dict[str, torch.Tensor], order: torch.Tensor, world: int) -> None:
        super().__init__()
        self.batch, self.order, self.world = batch, order, world
        self.consumed: list[int] = []

    def train_dataloader(self):
        rows = self.order.view(self.world, -1)[self.trainer.global_rank]
        return DataLoader([{k: v[rows] for k, v in self.batch.items()}], batch_size=None)

    def mark_consumed(self, n: int) -> None:
        self.consumed.append(n)


def main(out: str, mode: str, decode: str = "eager") -> None:
    torch.set_num_threads(1)
    world = 1 if mode == "single" else 2
    module = tiny_module(
        sampling=SamplingConfig(max_new_tokens=10, do_sample=False, decode=decode),
        # max_grad_norm small enough that both optimizers' gradients are clipped
        # the default whitening (advantages, over all processes) and score whitening with it
        ppo=PPOConfig(epochs=1, minibatch_size=8 // world, max_grad_norm=0.02),
        reward=RewardConfig(whiten="scores"),
        kl=KLConfig(kind="fixed", init_coef=0.05),
        max_rollouts=1,
        export_dir=f"{out}/export",
    )
    # "." ends a response too, so the greedy responses end at different steps (3 to 10 tokens).
    module.stop_ids = (*module.stop_ids, module.tokenizer.convert_tokens_to_ids("."))
    batch = prompt_batch(module.tokenizer, PROMPTS)
    with torch.no_grad():
        eager = dataclasses.replace(module.sampling, decode="eager")  # compiles nothing before the run
        pre = generate_responses(
            module.policy,
            batch["input_ids"],
            batch["attention_mask"],
            eager,
            module.stop_ids,
            module.tokenizer.pad_token_id,
        )
    order = torch.argsort(pre.response_mask.sum(1), stable=True)  # shortest responses first (rank 0)

    record: dict = {
        "responses": [],
        "eager_responses": [],
        "minibatches": [],
        "grads": [],
        "clipped": [],
        "lengths": pre.response_mask.sum(1)[order],
    }
    generate, minibatch_loss, before_step = module.generate, module.minibatch_loss, module.on_before_optimizer_step
    make_rollout = module.make_rollout

    def recording_make_rollout(b, timer, *args):
        rollout, experience = make_rollout(b, timer, *args)
        fields = (
            "raw_scores",
            "scores",
            "advantages",
            "response_mask",
            "response_ids",
            "query_responses",
            "attention_mask",
            "old_values",
            "returns",
        )
        record["rollout"] = {k: getattr(rollout, k).clone() for k in fields}
        return rollout, experience

    def recording_generate(b):
        gen = generate(b)
        record["responses"].append(gen.response_ids.clone())
        if decode == "compiled":  # the eager path on the same prompts, in this process (greedy: no RNG)
            compiled, module.sampling = module.sampling, eager
            record["eager_responses"].append(generate(b).response_ids.clone())
            module.sampling = compiled
        return gen

    def recording_minibatch_loss(mb, *args):
        loss, stats = minibatch_loss(mb, *args)
        record["minibatches"].append(
            {
                "policy": float(stats.logged["loss/policy"]),
                "value": float(stats.logged["loss/value"]),
                "tokens": int(mb.response_mask.sum()),
            }
        )
        return loss, stats

    def recording_before_step(optimizer):
        params = {id(p) for g in optimizer.param_groups for p in g["params"]}
        named = [(n, p) for n, p in module.named_parameters() if id(p) in params and p.grad is not None]
        record["grads"].append({n: full(p.grad) for n, p in named})  # collective under FSDP: all ranks
        before_step(optimizer)  # the non-finite check and the clip to ppo.max_grad_norm
        record["clipped"].append({n: full(p.grad) for n, p in named})

    module.generate, module.minibatch_loss = recording_generate, recording_minibatch_loss
    module.make_rollout = recording_make_rollout
    module.on_before_optimizer_step = recording_before_step
    strategy = {"single": "auto", "ddp": "ddp", "fsdp2": "fsdp2"}[mode]
    trainer = tiny_trainer(out, strategy=strategy, devices=world, use_distributed_sampler=False)
    before = compile_stats()
    trainer.fit(module, datamodule=RankPrompts(batch, order, world))

    after = compile_stats()
    record["compile_stats"] = {"graphs": after.graphs - before.graphs, "calls": after.calls - before.calls}
    record["metrics"] = module.last_rollout_metrics
    gathered = full_state_dict(module.policy)  # collective under FSDP
    record["policy"] = gathered if gathered is not None else {k: full(v) for k, v in module.policy.state_dict().items()}
    record["own_numel"] = sum(
        (p.to_local() if isinstance(p, DTensor) else p).numel() for p in module.policy.parameters()
    )
    record["full_numel"] = sum(p.numel() for p in module.policy.parameters())
    if trainer.global_rank == 0 or mode == "ddp":  # under FSDP only rank 0 holds the gathered weights
        torch.save(record, f"{out}/rank{trainer.global_rank}.pt")
    elif mode == "fsdp2":
        record.pop("policy")
        torch.save(record, f"{out}/rank{trainer.global_rank}.pt")

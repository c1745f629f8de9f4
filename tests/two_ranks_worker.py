"""The code paths taken only with several processes, called on 2 ranks (read by tests/test_two_ranks.py).

:func:`run` is one part of the suite's two-process launch (tests/ppo/two_process_worker.py): on
each of the 2 CPU processes of its gloo process group (no Trainer: a Lightning ``DDPStrategy``
reduces, as in a ddp run) and a 1-D device mesh over them, each rank calls the library's cross-rank
functions on its own part of fixed inputs (the same seeds on both ranks; rank r takes its part)
and writes what they returned to ``OUT/rank<r>.pt``; an expected failure is written as its message.
The test compares with values worked by hand or with one process run on the whole input.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.distributed as dist

WORLD = 2


def whitening_inputs() -> dict[str, torch.Tensor]:
    """A batch of 6 rows; rank 0 takes rows 0-1 (short responses), rank 1 rows 2-5."""
    g = torch.Generator().manual_seed(0)
    rewards = torch.randn(6, 7, generator=g)  # (6, 7)
    values = torch.randn(6, 7, generator=g)  # (6, 7)
    lengths = torch.tensor([2, 3, 7, 6, 7, 5])
    mask = torch.arange(7) < lengths.unsqueeze(1)  # (6, 7)
    raw_scores = torch.randn(6, generator=g) * 2 + 1  # (6,)
    return {"rewards": rewards, "values": values, "mask": mask, "raw_scores": raw_scores}


RANK_ROWS = (slice(0, 2), slice(2, 6))


def reference_texts() -> list[list[str]]:
    """Four reference batches for the reward normalisation; rank r scores batches r and r + 2."""
    return [
        ["Once upon a time there was a cat.", "Tom had a red ball."],
        ["The dog ran to the park and played.", "Lily was happy.", "A big tree fell."],
        ["Sam and Mia found a shell.", "It was sunny."],
        ["Ben was sad because it rained all day."],
    ]


def _whitening(rank: int, trainer) -> dict:
    from rlhf_lit.stages.ppo.config import PPOConfig, RewardConfig
    from rlhf_lit.stages.ppo.estimator import AdvantageEstimator
    from rlhf_lit.stages.ppo.ranks import sum_over_ranks, whitening_reducer

    inputs = {k: v[RANK_ROWS[rank]] for k, v in whitening_inputs().items()}
    reduce_sum = whitening_reducer("global", trainer)
    out = {"rank_scope_reducer": whitening_reducer("rank", trainer)}
    out["gae"] = AdvantageEstimator(PPOConfig(estimator="gae"))(
        inputs["rewards"], inputs["values"], inputs["mask"], reduce_sum
    )[0]
    out["reinforce_pp"] = AdvantageEstimator(PPOConfig(estimator="reinforce_pp"))(
        inputs["rewards"], None, inputs["mask"], reduce_sum
    )[0]
    ended = torch.ones_like(inputs["raw_scores"], dtype=torch.bool)
    out["scores"] = RewardConfig(whiten="scores").shape(inputs["raw_scores"], ended, reduce_sum)
    given = torch.tensor([1.0, 2.0 + rank])
    out["reduced"], out["given"] = sum_over_ranks(trainer)(given), given
    return out


def _ppo_reductions(rank: int, trainer) -> dict:
    from lightning.pytorch.strategies import DDPStrategy

    from rlhf_lit.stages.ppo.metrics import reduce_over_ranks
    from rlhf_lit.stages.ppo.ranks import sum_over_ranks
    from rlhf_lit.stages.ppo.rollout import Rollout, nonfinite_rollout_parts
    from rlhf_lit.stages.ppo.update import rank_token_weight

    tokens = (3, 5)[rank]
    mask = torch.arange(4) < torch.tensor([[tokens - 2], [2]])  # (2, 4): rank 0 holds 3 tokens, rank 1 5
    local = {"objective/x": (1.0, 3.0)[rank], "objective/y": torch.tensor((10.0, -2.0)[rank])}
    zeros = torch.zeros(2, 4)
    raw_scores = torch.tensor([0.5, float("nan")]) if rank == 1 else torch.tensor([0.5, 1.0])
    ref_logprobs = zeros.clone()
    ref_logprobs[0, 3] = float("inf")  # off the response mask: not a problem
    rollout = Rollout(
        query_responses=torch.zeros(2, 6, dtype=torch.long),
        attention_mask=torch.ones(2, 6, dtype=torch.long),
        response_ids=torch.zeros(2, 4, dtype=torch.long),
        response_mask=(torch.arange(4) < 3).expand(2, 4),
        ended=torch.ones(2, dtype=torch.bool),
        old_logprobs=zeros,
        ref_logprobs=ref_logprobs,
        old_values=zeros,
        raw_scores=raw_scores,
        scores=raw_scores,
        kl=zeros,
        rewards=zeros,
        advantages=zeros,
        returns=zeros,
    )
    return {
        "token_weight": float(rank_token_weight(mask, trainer)),
        "metrics": reduce_over_ranks(DDPStrategy(), local, torch.device("cpu")),
        "nonfinite": nonfinite_rollout_parts(rollout, sum_over_ranks(trainer)),
    }


def _sharded_checks(rank: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from rlhf_lit.models.sharding import any_rank
    from rlhf_lit.stages.nonfinite import NonFiniteError, assert_finite, gradients_finite

    mesh = init_device_mesh("cpu", (WORLD,))
    weight = torch.nn.Parameter(distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)]))
    out = {
        "any_rank_none": any_rank(False, [weight]),
        "any_rank_one": any_rank(rank == 1, [weight]),
        "any_rank_plain": any_rank(rank == 1, [torch.ones(2)]),
    }
    grad = torch.ones(4, 2)
    grad[3, 1] = float("nan")  # row 3 is in rank 1's shard
    weight.grad = distribute_tensor(grad, mesh, [Shard(0)])
    out["gradients_finite"] = gradients_finite(torch.optim.SGD([weight], lr=0.1))
    state = {"w": distribute_tensor(grad, mesh, [Shard(0)])}
    try:
        assert_finite(state, "the policy")
        out["assert_finite"] = None
    except NonFiniteError as error:
        out["assert_finite"] = str(error)
    return out


def _samplers() -> dict:
    from rlhf_lit.data.sampler import PassSampler, ResumableSampler

    resumable = ResumableSampler(11, seed=1)  # world and rank from the process group
    resumable.set_epoch(0)
    passes = PassSampler(7, seed=0)
    return {"resumable": list(resumable), "resumable_len": len(resumable), "pass": list(passes)}


def _reward_normalization(rank: int, trainer) -> dict:
    from assets_paths import STORIES260K

    from rlhf_lit.stages.reward_model import RewardModelModule

    torch.manual_seed(0)  # the new score head: the same model on both ranks
    module = RewardModelModule(model=str(STORIES260K), normalize="gain_bias")
    module._trainer = trainer
    batches = [dict(module.tokenizer(texts, return_tensors="pt", padding=True)) for texts in reference_texts()]
    with torch.no_grad():
        every_score = torch.cat([module.raw_scores(b["input_ids"], b["attention_mask"]) for b in batches])
    gain, bias = module.normalize(batches[rank::WORLD], "two halves")
    return {"gain": gain, "bias": bias, "every_score": every_score}


def run(rank: int, out: str) -> None:
    """One rank, in the launch's process group (2 gloo ranks): run every check, write ``OUT/rank<rank>.pt``."""
    assert dist.get_world_size() == WORLD
    from lightning.pytorch.strategies import DDPStrategy

    trainer = SimpleNamespace(strategy=DDPStrategy(), world_size=WORLD)  # what the stages read of a Trainer
    record = {
        "whitening": _whitening(rank, trainer),
        "ppo": _ppo_reductions(rank, trainer),
        "sharded": _sharded_checks(rank),
        "samplers": _samplers(),
        "reward_normalization": _reward_normalization(rank, trainer),
    }
    torch.save(record, f"{out}/rank{rank}.pt")
    dist.barrier()

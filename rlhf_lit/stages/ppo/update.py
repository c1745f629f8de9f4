"""The PPO update on one rollout: K epochs of shuffled minibatches, an optimizer step every
``grad_accum`` of them (:func:`train_on_rollout`), and the token weighting across ranks."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import torch

from rlhf_lit.stages.amp import one_scaler_update
from rlhf_lit.stages.ppo.loss import LossStats
from rlhf_lit.stages.ppo.rollout import Rollout, minibatches
from rlhf_lit.stages.ppo.seeding import STREAM_SHUFFLE

if TYPE_CHECKING:
    from rlhf_lit.stages.ppo.first_forward import FirstForward
    from rlhf_lit.stages.ppo.protocols import UpdateStage


def train_on_rollout(stage: UpdateStage, rollout: Rollout, first: FirstForward | None = None) -> LossStats:
    """K epochs of shuffled minibatches; an optimizer step every ``grad_accum`` minibatches.

    Returns the :class:`~rlhf_lit.stages.ppo.loss.LossStats` of
    :meth:`~rlhf_lit.stages.ppo.protocols.UpdateStage.minibatch_loss`: each logged statistic averaged over every minibatch, ``old_logprob_diff`` its token mean over the
    minibatches trained before the first optimizer step (the first ``grad_accum`` of the first epoch),
    whose forward scores the rollout's tokens with the weights that sampled them.

    ``first``: the first minibatch's forward ran while the rollout was scored
    (:mod:`~rlhf_lit.stages.ppo.first_forward`); that minibatch's loss takes its outputs.
    """
    cfg = stage.ppo
    optimizers = stage.optimizer_list()
    generator = stage.stream_generator(STREAM_SHUFFLE)
    history: list[dict[str, torch.Tensor]] = []
    before_update: list[tuple[torch.Tensor, torch.Tensor]] = []  # (token mean, tokens) per minibatch
    for epoch in range(cfg.epochs):
        for i, mb in enumerate(minibatches(rollout, cfg.minibatch_size, generator)):
            passes = first.take(mb.response_ids) if first is not None and epoch == 0 and i == 0 else None
            loss, stats = stage.minibatch_loss(mb, passes)
            stage.manual_backward(loss / cfg.grad_accum)  # once, on the sum: DDP sees every parameter
            if epoch == 0 and i < cfg.grad_accum:
                before_update.append((stats.old_logprob_diff, mb.response_mask.sum()))
            history.append(stats.logged)
            if (i + 1) % cfg.grad_accum == 0:
                with one_scaler_update(stage.trainer):  # fp16: both optimizers see one loss scale
                    for opt in optimizers:
                        opt.step()  # clips in on_before_optimizer_step
                for opt in optimizers:
                    opt.zero_grad(set_to_none=True)
    averaged = {k: torch.stack([h[k] for h in history]).mean() for k in history[0]}
    tokens = torch.stack([n for _, n in before_update]).sum()  # ()
    return LossStats(averaged, torch.stack([d * n for d, n in before_update]).sum() / tokens)  # (): the diff


def rank_token_weight(mask: torch.Tensor, trainer) -> torch.Tensor:
    """``n_rank * world_size / n_all``: turns this rank's token mean into its share of the token
    mean over the same minibatch of every rank, once DDP / FSDP average the gradients.

    Ranks hold different numbers of response tokens (responses end at different lengths);
    averaging per-rank means would weight a token of a short-response rank more. One small
    all-reduce per minibatch, no host sync; exactly 1 on a single process (or without a trainer).
    """
    world = trainer.world_size if trainer is not None else 1
    count = mask.sum().float()  # ()
    if world == 1:
        return torch.ones((), device=mask.device)
    return count * world / trainer.strategy.reduce(count.clone(), reduce_op="sum")  # () (reduce is in place)


def cycle(loader: Iterable) -> Iterator[dict[str, torch.Tensor]]:
    """Endless passes over a re-iterable loader (not itertools.cycle, which keeps every batch)."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise RuntimeError("ptx_dataloader() gave no batch (or is a one-shot iterator)")

"""The experience maker: prompts in, a scored :class:`~rlhf_lit.stages.ppo.rollout.Rollout` out.

generate -> (with ``reward.calibration``: the reference's K samples per prompt and their raw scores,
:mod:`~rlhf_lit.stages.ppo.reference_calibration`) -> score (old logprobs, reference logprobs,
values, reward model; in chunks) -> raw score from the reward sources -> (its calibrated quantile)
-> shaped score (:func:`rlhf_lit.functional.shape_scores`) -> per-token rewards with the KL penalty
-> advantages and returns. All without gradients.

The responses are decoded at most once per rollout: for the reward functions when there are any,
else after the update for the text metrics (:class:`RolloutInfo` carries them there).

Names, against OpenRLHF's: what its experience maker makes, an ``Experience`` (the sequences, old
and reference logprobs, values, advantages, returns of a batch), is our
:class:`~rlhf_lit.stages.ppo.rollout.Rollout`; what it keeps in ``Experience.info`` (per-rollout
statistics beside the tensors the loss reads) is our :class:`RolloutInfo` (``Experience`` is its
deprecated alias, removed in 0.3.0).

The maker reads of the stage only what a :class:`~rlhf_lit.stages.ppo.protocols.RolloutStage` names
(the models, settings and reward sources, the sampling and reward-model seams, the seeds).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import partial
from typing import TYPE_CHECKING

import torch

from rlhf_lit.evaluation import prompt_texts, response_texts
from rlhf_lit.evaluation.judges import Judge, JudgeReads, judge_scores, needs_prompts
from rlhf_lit.functional import (
    attended_span,
    entropy_from_logits,
    kl_penalized_rewards,
    length_groups,
    masked_mean,
    masked_whiten,
    member_std,
    token_logprobs,
)
from rlhf_lit.models.generation import Generated, generate_responses
from rlhf_lit.models.sharding import gathered_for_generation, is_sharded, reshard
from rlhf_lit.stages.ppo.checks import check_whitening_rows
from rlhf_lit.stages.ppo.estimator import repeat_prompts
from rlhf_lit.stages.ppo.first_forward import FirstForward, first_forward
from rlhf_lit.stages.ppo.ranks import whitening_reducer
from rlhf_lit.stages.ppo.reference_calibration import ReferenceCalibration
from rlhf_lit.stages.ppo.reward_sources import reward_batch
from rlhf_lit.stages.ppo.rollout import Rollout

if TYPE_CHECKING:
    from lightning.pytorch import Trainer

    from rlhf_lit.stages.ppo.metrics import RolloutTimer
    from rlhf_lit.stages.ppo.protocols import RolloutStage


@dataclass
class Scored:
    """What the no-grad scoring passes give for some rows of a rollout (``(B, R)`` unless noted)."""

    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor
    old_values: torch.Tensor  # zeros without a critic (never read by a loss)
    entropy: torch.Tensor
    rm_scores: (
        torch.Tensor | None
    )  # (B,) the reward model's scores, (B, M) an ensemble's; None when no source is the RM

    @staticmethod
    def cat(parts: list[Scored]) -> Scored:
        """The chunks of one rollout joined along the rows."""
        joined = {}
        for f in fields(Scored):
            values = [getattr(p, f.name) for p in parts]
            joined[f.name] = None if values[0] is None else torch.cat(values)
        return Scored(**joined)

    def rows(self, index: torch.Tensor) -> Scored:
        """The rows a ``(M,)`` index tensor names, of every field."""
        return Scored(
            **{f.name: None if getattr(self, f.name) is None else getattr(self, f.name)[index] for f in fields(Scored)}
        )

    def padded_to(self, response_length: int) -> Scored:
        """The per-token fields right-padded with zeros to ``response_length`` columns (positions a
        trimmed chunk did not score: after every one of its responses ended, masked everywhere)."""
        extra = response_length - self.old_logprobs.shape[1]
        if extra == 0:
            return self
        pad = lambda t: torch.nn.functional.pad(t, (0, extra))  # noqa: E731
        return Scored(
            pad(self.old_logprobs), pad(self.ref_logprobs), pad(self.old_values), pad(self.entropy), self.rm_scores
        )


@dataclass
class RolloutInfo:
    """What a rollout leaves besides the :class:`Rollout` itself (OpenRLHF's ``Experience.info``):
    rollout-time statistics and the decoded responses (None until something needed them)."""

    entropy: torch.Tensor  # () masked mean entropy of the policy at rollout time
    reward_parts: dict[str, torch.Tensor]  # reward/<source> -> (B,) each source's unweighted score
    texts: list[str] | None = None  # the responses as a judge reads them
    reward_std: torch.Tensor | None = (
        None  # (B,) population std of a reward-model ensemble's member scores per response
    )
    # The old logprobs are the ones recorded while sampling (ppo.old_logprobs: sampling): then the
    # update's first forward measures policy/logprob_gen_train_diff, not the rollout.
    old_logprobs_sampled: bool = False
    # () policy/logprob_gen_train_diff of a rescored rollout: mean |recorded - rescored| over response
    # tokens; None when the old logprobs are the recorded ones or nothing was recorded.
    gen_train_diff: torch.Tensor | None = None
    # The update's first minibatch forward, run while scoring (ppo.reuse_first_forward); None when not reused.
    first_forward: FirstForward | None = None


Experience = RolloutInfo
"""Deprecated, removed in 0.3.0: the former name of :class:`RolloutInfo` (``Experience.reward_std``)."""


def sample_responses(
    policy: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    stage: RolloutStage,
    generator: torch.Generator,
    return_logprobs: bool = True,
) -> Generated:
    """Sample responses to the prompts of ``batch`` with the unwrapped ``policy`` (the stage's, or its
    reference), as the ``stage`` samples (its ``sampling``, stop ids and pad id), recording their logprobs
    (``return_logprobs``: the old logprobs or the mismatch metric; a calibrated reward's reference
    samples need none, and are drawn the same without them).

    Under FSDP the ranks step together until every rank's responses have ended (each forward
    pass is a collective; ``synced_gpus``), with the policy's weights gathered once for the call.
    """
    synced = is_sharded(policy) and torch.distributed.is_initialized()
    with gathered_for_generation(policy):
        return generate_responses(
            policy,
            batch["input_ids"],
            batch["attention_mask"],
            stage.sampling,
            eos_token_id=stage.stop_ids,
            pad_token_id=stage.tokenizer.pad_token_id,
            generator=generator,
            synced_gpus=synced,
            return_logprobs=return_logprobs,  # (B, R)
        )


@dataclass(eq=False)
class ExperienceMaker:
    """Turns a batch of prompts into a rollout for a PPO stage.

    ``stage`` (:class:`~rlhf_lit.stages.ppo.protocols.RolloutStage`) is read when the maker runs: its
    models as it holds them then (sharded, moved to its device, or changed by a test), its settings,
    and its seams (``generate``, ``score``, ``reward_model_inputs``: a test's or a callback's override
    is the one used).
    """

    stage: RolloutStage

    def __post_init__(self) -> None:
        # reward.calibration: the reference's K samples per prompt rank the raw scores; None when off.
        reward = self.stage.reward_cfg
        sample = partial(sample_responses, return_logprobs=False)
        self.calibration = ReferenceCalibration(reward, sample) if reward.calibrated else None

    def uses_sampled_logprobs(self, gen: Generated) -> bool:
        """The rollout's old logprobs (and entropy) are the ones recorded while sampling: ``ppo.old_logprobs:
        sampling``, unless the policy forward runs anyway (a shared-trunk critic), and a generation that recorded
        them (a ``generate`` replaced by a script records none: then the policy rescores)."""
        critic = self.stage.critic
        shared = critic is not None and critic.needs_policy_hidden
        return self.stage.ppo.old_logprobs == "sampling" and not shared and gen.logprobs is not None

    @torch.no_grad()
    def score_chunk(self, gen: Generated, first: FirstForward | None = None) -> Scored:
        """Old logprobs, reference logprobs, values, entropy and the reward model's scores (when
        it is a source; the reward functions are called once per rollout in :meth:`make`) of a few rows.

        The passes run over the rows without the padding none of them attends (:meth:`Generated.trimmed`);
        the per-token fields come back at the full response length, zero where nothing was scored.
        ``first``: these rows are the update's first minibatch, whose forward gave their policy and
        critic outputs already (:mod:`~rlhf_lit.stages.ppo.first_forward`); only the frozen models run.
        """
        response_length = gen.response_ids.shape[1]
        gen = gen.trimmed()
        prompt_length = gen.prompt_length
        m = self.stage
        temperature = m.sampling.temperature
        ids, mask = gen.query_responses, gen.attention_mask
        sampled = self.uses_sampled_logprobs(gen)
        if first is not None:  # the first minibatch's forward, cut to the scored columns
            kept = gen.response_ids.shape[1]
            old_logprobs, entropy, values = (None if t is None else t[:, :kept] for t in first.scores(temperature))
        elif sampled:  # the critic alone: the logprobs come from sampling (below)
            values = (
                None if m.critic is None else m.forward_passes.critic_values(m.critic, ids, mask, prompt_length)
            )  # (B, R)
        else:
            logits, values = m.forward_passes.policy_and_values(
                m.policy, m.critic, ids, mask, prompt_length
            )  # (B, R, V), (B, R)
            old_logprobs = token_logprobs(logits, gen.response_ids, temperature)  # (B, R)
            entropy = entropy_from_logits(logits, temperature)  # (B, R)
        if sampled:  # ppo.old_logprobs "sampling": recorded while generate sampled
            old_logprobs, entropy = gen.logprobs, gen.entropy  # (B, R) x2
        return Scored(
            old_logprobs=old_logprobs,
            ref_logprobs=m.reference.logprobs(gen, temperature),  # (B, R)
            old_values=torch.zeros_like(old_logprobs) if values is None else values.float(),  # (B, R)
            entropy=entropy,  # (B, R)
            rm_scores=m.score(*m.reward_model_inputs(gen)).float() if m.reward_cfg.uses_reward_model else None,
        ).padded_to(response_length)

    def score_rollout(self, gen: Generated, first: FirstForward | None = None) -> Scored:
        """:meth:`score_chunk` over the batch in chunks of ``ppo.score_chunk_size`` rows, or (unset) in
        its length groups (:func:`~rlhf_lit.functional.length_groups`: one chunk unless a long
        prompt would pad the other rows).

        Chunks take the rows in order of their prompt's length, so that the rows that share a chunk
        share its padding and each chunk cuts the most (:meth:`Generated.trimmed`); the scores
        come back in the rollout's row order. With ``first``, its rows take their policy and critic
        outputs from it and the other rows are scored in chunks.
        """
        if first is not None:
            parts = [self.score_chunk(gen.rows(first.rows), first)]
            if first.others.numel() > 0:
                parts.append(self.score_rollout(gen.rows(first.others)))
            return Scored.cat(parts).rows(torch.argsort(torch.cat([first.rows, first.others])))
        rows = gen.response_ids.shape[0]
        size = self.stage.ppo.score_chunk_size or rows
        if size >= rows:  # one chunk, or the rows' length groups when a long prompt would pad the others
            chunks = [g.to(gen.response_ids.device) for g in length_groups(gen.attention_mask)]
            if len(chunks) == 1 or is_sharded(self.stage.policy):
                return self.score_chunk(gen)
        else:
            # stable: rows of equal length keep their order; the sort needs no host read
            order = torch.argsort(gen.attention_mask[:, : gen.prompt_length].sum(dim=1), stable=True)  # (B,)
            chunks = list(order.split(size))
        scored = Scored.cat([self.score_chunk(gen.rows(chunk)) for chunk in chunks])
        return scored.rows(torch.argsort(torch.cat(chunks)))  # back to the rollout's order

    def make(
        self,
        batch: dict[str, torch.Tensor],
        timer: RolloutTimer | None,
        reuse_first_forward: bool = False,
        trainer: Trainer | None = None,
    ) -> tuple[Rollout, RolloutInfo]:
        """Generate, score, shape rewards and compute advantages (the module docstring's steps).

        ``reuse_first_forward``: run the update's first minibatch forward now and score its rows
        with it (:mod:`~rlhf_lit.stages.ppo.first_forward`); the :class:`RolloutInfo` carries it.
        ``trainer``: the run's processes (their rows, the whitening's sums); None: one process.
        """
        m = self.stage
        world_size = trainer.world_size if trainer is not None else 1
        check_whitening_rows(batch["input_ids"].shape[0], world_size, m.ppo, m.reward_cfg)  # before any work
        prompts = batch
        batch = repeat_prompts(batch, m.sampling.samples_per_prompt)  # k consecutive rows per prompt
        batch = without_common_padding(batch)  # nothing of the rollout reads a column no prompt attends
        gen = m.generate(batch)
        _mark(timer, "generate")
        reference = None
        if self.calibration is not None:  # after the policy sampled: its own stream, the policy's untouched
            reference = self.calibration.draw(
                m, without_common_padding(repeat_prompts(prompts, self.calibration.k))
            )  # (P, K)
            _mark(timer, "reference")
        first = first_forward(m, m.forward_passes, m.ppo.minibatch_size, gen) if reuse_first_forward else None
        scored = self.score_rollout(gen, first)
        for frozen in m.frozen_submodules().values():
            reshard(frozen)  # under FSDP: free the root weights a no-grad pass leaves gathered
        mask = gen.response_mask  # (B, R)
        texts, decoded = None, None
        if m.reward_sources.needs_texts:
            decoded = reward_batch(m.tokenizer, batch, gen)
            texts = list(decoded.responses)  # a copy: a reward function may change its batch
        raw_scores, reward_parts = m.reward_sources(scored.rm_scores, decoded)  # (B,), {name: (B,)}
        calibrated = raw_scores
        if self.calibration is not None:  # the raw score's quantile among its prompt's reference scores
            calibrated, calibration_parts = self.calibration.calibrate(raw_scores, reference)  # (B,)
            reward_parts.update(calibration_parts)
        # Every whitening below is over the rows of all processes (ppo.whiten_scope: global) or of this one.
        reduce_sum = whitening_reducer(m.ppo.whiten_scope, trainer)
        scores = m.reward_cfg.shape(calibrated, gen.ended, reduce_sum)  # (B,): one placement path for every source
        # kl.mode "loss": the KL is measured (metrics, controller) but paid in the loss, not here.
        reward_kl_coef = m.kl_ctl.value if m.kl_cfg.mode == "reward" else 0.0
        rewards, kl = kl_penalized_rewards(
            scores, scored.old_logprobs, scored.ref_logprobs, mask, reward_kl_coef, m.kl_cfg.estimator
        )  # (B, R), (B, R)
        if m.reward_cfg.whiten == "rewards":
            rewards = masked_whiten(rewards, mask, keep_mean=True, reduce_sum=reduce_sum)  # (B, R)
        values = scored.old_values if m.critic is not None else None
        advantages, returns = m.estimator(rewards, values, mask, reduce_sum)  # (B, R) x2
        _mark(timer, "score")
        rollout = Rollout(
            query_responses=gen.query_responses,
            attention_mask=gen.attention_mask,
            response_ids=gen.response_ids,
            response_mask=mask,
            ended=gen.ended,
            old_logprobs=scored.old_logprobs,
            ref_logprobs=scored.ref_logprobs,
            old_values=scored.old_values,
            raw_scores=raw_scores,
            scores=scores,
            kl=kl,
            rewards=rewards,
            advantages=advantages,
            returns=returns,
        )
        entropy = masked_mean(scored.entropy, mask)  # ()
        ensemble = scored.rm_scores is not None and scored.rm_scores.dim() == 2
        reward_std = member_std(scored.rm_scores) if ensemble else None  # (B,): for a watchdog reading disagreement
        sampled = self.uses_sampled_logprobs(gen)
        gen_train_diff = None
        if gen.logprobs is not None and not sampled:  # rescored: the rescore is the training pass's forward
            gen_train_diff = masked_mean((gen.logprobs - scored.old_logprobs).abs(), mask)  # ()
        return rollout, RolloutInfo(
            entropy, {k: v.mean() for k, v in reward_parts.items()}, texts, reward_std, sampled, gen_train_diff, first
        )

    def texts(self, rollout: Rollout, info: RolloutInfo) -> list[str]:
        """The responses as a judge reads them, decoded now unless the reward functions did already."""
        if info.texts is None:
            info.texts = response_texts(
                self.stage.tokenizer,
                rollout.query_responses,
                rollout.attention_mask,
                rollout.response_mask,
                rollout.ended,
            )
        return info.texts


def judged_scores(
    maker: ExperienceMaker, rollout: Rollout, info: RolloutInfo, judge: Judge, reads: JudgeReads
) -> list[float]:
    """The judge's scores of a rollout's responses (:func:`~rlhf_lit.evaluation.judges.judge_scores`, on the
    stage's device): it reads what ``reads`` says, the prompts as the policy read them
    (:func:`~rlhf_lit.evaluation.texts.prompt_texts`) decoded only when it reads them."""
    texts = maker.texts(rollout, info)
    prompts = prompt_texts(maker.stage.tokenizer, rollout) if needs_prompts(judge, reads) else []
    return judge_scores(judge, prompts, texts, reads, maker.stage.device)


def without_common_padding(batch: dict) -> dict:
    """The prompt batch without its leading columns that no row attends (a batch padded to a fixed
    length): generation's prefill and every pass after it skip them, with the same outputs up to
    the order of float sums (:func:`~rlhf_lit.functional.attended_span`)."""
    first, _ = attended_span(batch["attention_mask"], batch["attention_mask"].shape[1])
    if first == 0:
        return batch
    return {**batch, "input_ids": batch["input_ids"][:, first:], "attention_mask": batch["attention_mask"][:, first:]}


def _mark(timer: RolloutTimer | None, phase: str) -> None:
    if timer is not None:
        timer.mark(phase)

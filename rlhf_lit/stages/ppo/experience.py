"""The experience maker: prompts in, a scored :class:`~rlhf_lit.stages.ppo.rollout.Rollout` out.

generate -> score (old logprobs, reference logprobs, values, reward model; in chunks) -> raw score
from the reward sources -> shaped score (:func:`rlhf_lit.functional.shape_scores`) -> per-token
rewards with the KL penalty -> advantages and returns. All without gradients.

The responses are decoded at most once per rollout: for the reward functions when there are any,
else after the update for the text metrics (:class:`Experience` carries them there).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import torch

from rlhf_lit.evaluation import prompt_texts, response_texts
from rlhf_lit.evaluation.judges import JudgeReads, judge_texts
from rlhf_lit.functional import (
    attended_span, entropy_from_logits, kl_penalized_rewards, length_groups, masked_mean, masked_whiten, member_std,
    token_logprobs,
)
from rlhf_lit.models import sequence_scores
from rlhf_lit.models.reward_ensemble import RewardEnsemble
from rlhf_lit.models.generation import Generated, generate_responses
from rlhf_lit.models.memory import call_on_own_device
from rlhf_lit.models.reward_norm import reward_offset
from rlhf_lit.models.scoring import reward_model_rows
from rlhf_lit.models.sharding import gathered_for_generation, is_sharded, reshard
from rlhf_lit.stages.ppo.checks import check_whitening_rows
from rlhf_lit.stages.ppo.estimator import repeat_prompts
from rlhf_lit.stages.ppo.first_forward import FirstForward, first_forward
from rlhf_lit.stages.ppo.ranks import whitening_reducer
from rlhf_lit.stages.ppo.reward_sources import reward_batch
from rlhf_lit.stages.ppo.rollout import Rollout
from rlhf_lit.stages.ppo.seeding import STREAM_SAMPLE

if TYPE_CHECKING:
    from rlhf_lit.stages.ppo.metrics import RolloutTimer
    from rlhf_lit.stages.ppo.module import PPOModule


@dataclass
class Scored:
    """What the no-grad scoring passes give for some rows of a rollout (``(B, R)`` unless noted)."""

    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor
    old_values: torch.Tensor  # zeros without a critic (never read by a loss)
    entropy: torch.Tensor
    rm_scores: torch.Tensor | None  # (B,) the reward model's scores, (B, M) an ensemble's; None when no source is the RM

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
        return Scored(**{f.name: None if getattr(self, f.name) is None else getattr(self, f.name)[index]
                         for f in fields(Scored)})  # fmt: skip

    def padded_to(self, response_length: int) -> Scored:
        """The per-token fields right-padded with zeros to ``response_length`` columns (positions a
        trimmed chunk did not score: after every one of its responses ended, masked everywhere)."""
        extra = response_length - self.old_logprobs.shape[1]
        if extra == 0:
            return self
        pad = lambda t: torch.nn.functional.pad(t, (0, extra))  # noqa: E731
        return Scored(pad(self.old_logprobs), pad(self.ref_logprobs), pad(self.old_values), pad(self.entropy),
                      self.rm_scores)  # fmt: skip


@dataclass
class Experience:
    """What a rollout leaves besides the :class:`Rollout` itself: rollout-time statistics and the
    decoded responses (None until something needed them)."""

    entropy: torch.Tensor  # () masked mean entropy of the policy at rollout time
    reward_parts: dict[str, torch.Tensor]  # reward/<source> -> (B,) each source's unweighted score
    texts: list[str] | None = None  # the responses as a judge reads them
    reward_std: torch.Tensor | None = None  # (B,) population std of a reward-model ensemble's member scores per response
    # The old logprobs are the ones recorded while sampling (ppo.old_logprobs: sampling): then the
    # update's first forward measures policy/logprob_gen_train_diff, not the rollout.
    old_logprobs_sampled: bool = False
    # () policy/logprob_gen_train_diff of a rescored rollout: mean |recorded - rescored| over response
    # tokens; None when the old logprobs are the recorded ones or nothing was recorded.
    gen_train_diff: torch.Tensor | None = None
    # The update's first minibatch forward, run while scoring (ppo.reuse_first_forward); None when not reused.
    first_forward: FirstForward | None = None


class ExperienceMaker:
    """Turns a batch of prompts into a rollout for the PPO stage ``module``.

    It reads the stage's models and settings when it runs (not when built), so it always uses
    what the stage holds (sharded, moved to its device, or changed by a test).
    """

    def __init__(self, module: PPOModule) -> None:
        self.module = module

    def generate(self, batch: dict[str, torch.Tensor]) -> Generated:
        """Sample responses to the prompts of ``batch`` with the unwrapped policy.

        Under FSDP the ranks step together until every rank's responses have ended (each forward
        pass is a collective; ``synced_gpus``), with the policy's weights gathered once for the call.
        """
        m = self.module
        generator = m.stream_generator(STREAM_SAMPLE)
        synced = is_sharded(m.policy) and torch.distributed.is_initialized()
        with gathered_for_generation(m.policy):
            return generate_responses(
                m.policy, batch["input_ids"], batch["attention_mask"], m.sampling,
                eos_token_id=m.stop_ids, pad_token_id=m.tokenizer.pad_token_id, generator=generator,
                synced_gpus=synced, return_logprobs=True,  # (B, R): the old logprobs or the mismatch metric
            )  # fmt: skip

    @property
    def old_logprobs_from_sampling(self) -> bool:
        """``ppo.old_logprobs: sampling``, unless the policy forward runs anyway (a shared-trunk critic)."""
        m = self.module
        shared = m.critic is not None and m.critic.needs_policy_hidden
        return m.ppo.old_logprobs == "sampling" and not shared

    def uses_sampled_logprobs(self, gen: Generated) -> bool:
        """The rollout's old logprobs (and entropy) are the ones recorded while sampling: ppo.old_logprobs
        sampling (:attr:`old_logprobs_from_sampling`) and a generation that recorded them (a
        ``generate`` replaced by a script records none: then the policy rescores)."""
        return self.old_logprobs_from_sampling and gen.logprobs is not None

    def score(self, query_responses: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The reward model's score ``(B,)`` at the last attended token (the last response token).

        Adds the normalisation bias an exported RM could not fold into its weights (stored in its
        config; 0 when folded), so the score is the normalised reward for every architecture.
        An ensemble gives each member's normalised score, ``(B, M)``.
        """
        reward_model = self.module.reward_model
        if isinstance(reward_model, RewardEnsemble):
            return call_on_own_device(RewardEnsemble.__call__, reward_model, query_responses, attention_mask)  # (B, M)
        raw = call_on_own_device(sequence_scores, reward_model, query_responses, attention_mask)  # (B,)
        return raw + reward_offset(reward_model.config)  # (B,)

    def reward_model_inputs(self, gen: Generated) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows the reward model reads: as sampled, or with EOS after unfinished responses
        (``reward.unfinished``, :data:`~rlhf_lit.models.scoring.UnfinishedScoring`)."""
        m = self.module
        return reward_model_rows(
            gen.query_responses, gen.attention_mask, gen.ended, m.reward_cfg.unfinished, m.stop_ids[0],
            m.tokenizer.pad_token_id,
        )  # (B, T) or (B, T + 1), x2

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
        prompt_length = gen.query_responses.shape[1] - gen.response_ids.shape[1]
        m = self.module
        temperature = m.sampling.temperature
        ids, mask = gen.query_responses, gen.attention_mask
        if first is not None:  # the first minibatch's forward, cut to the scored columns
            kept = gen.response_ids.shape[1]
            old_logprobs, entropy, values = (None if t is None else t[:, :kept] for t in first.scores(temperature))
            if self.uses_sampled_logprobs(gen):
                old_logprobs, entropy = gen.logprobs, gen.entropy  # (B, R) x2
        elif self.uses_sampled_logprobs(gen):  # ppo.old_logprobs "sampling": recorded while generate sampled
            old_logprobs, entropy = gen.logprobs, gen.entropy  # (B, R) x2
            values = None if m.critic is None else m.forward_passes.critic_values(m.critic, ids, mask, prompt_length)  # (B, R)
        else:
            logits, values = m.forward_passes.policy_and_values(m.policy, m.critic, ids, mask, prompt_length)  # (B, R, V), (B, R)
            old_logprobs = token_logprobs(logits, gen.response_ids, temperature)  # (B, R)
            entropy = entropy_from_logits(logits, temperature)  # (B, R)
        return Scored(
            old_logprobs=old_logprobs,
            ref_logprobs=m.reference.logprobs(gen, temperature),  # (B, R)
            old_values=torch.zeros_like(old_logprobs) if values is None else values.float(),  # (B, R)
            entropy=entropy,  # (B, R)
            rm_scores=m.score(*self.reward_model_inputs(gen)).float() if m.reward_cfg.uses_reward_model else None,
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
        size = self.module.ppo.score_chunk_size or rows
        if size >= rows:  # one chunk, or the rows' length groups when a long prompt would pad the others
            groups = [g.to(gen.response_ids.device) for g in length_groups(gen.attention_mask)]
            if len(groups) == 1 or is_sharded(self.module.policy):
                return self.score_chunk(gen)
            order = torch.cat(groups)  # (B,)
            scored = Scored.cat([self.score_chunk(gen.rows(g)) for g in groups])
            return scored.rows(torch.argsort(order))  # back to the rollout's order
        prompt_length = gen.query_responses.shape[1] - gen.response_ids.shape[1]
        # stable: rows of equal length keep their order; the sort needs no host read
        order = torch.argsort(gen.attention_mask[:, :prompt_length].sum(dim=1), stable=True)  # (B,)
        by_length = gen.rows(order)
        scored = Scored.cat([self.score_chunk(by_length.rows(i, i + size)) for i in range(0, rows, size)])
        return scored.rows(torch.argsort(order))  # back to the rollout's order

    def make(
        self, batch: dict[str, torch.Tensor], timer: RolloutTimer | None, reuse_first_forward: bool = False
    ) -> tuple[Rollout, Experience]:
        """Generate, score, shape rewards and compute advantages (the module docstring's steps).

        ``reuse_first_forward``: run the update's first minibatch forward now and score its rows
        with it (:mod:`~rlhf_lit.stages.ppo.first_forward`); the :class:`Experience` carries it.
        """
        m = self.module
        world_size = m._trainer.world_size if m._trainer is not None else 1
        check_whitening_rows(batch["input_ids"].shape[0], world_size, m.ppo, m.reward_cfg)  # before any work
        batch = repeat_prompts(batch, m.sampling.samples_per_prompt)  # k consecutive rows per prompt
        batch = without_common_padding(batch)  # nothing of the rollout reads a column no prompt attends
        gen = m.generate(batch)
        _mark(timer, "generate")
        first = first_forward(m, gen) if reuse_first_forward else None
        scored = m.score_rollout(gen, first)
        for frozen in (m._modules.get("ref_policy"), m._modules.get("reward_model")):
            if frozen is not None:  # under FSDP: free the root weights a no-grad pass leaves gathered
                reshard(frozen)
        mask = gen.response_mask  # (B, R)
        texts, decoded = None, None
        if m.reward_sources.needs_texts:
            decoded = reward_batch(m.tokenizer, batch, gen)
            texts = list(decoded.responses)  # a copy: a reward function may change its batch
        raw_scores, reward_parts = m.reward_sources(scored.rm_scores, decoded)  # (B,), {name: (B,)}
        # Every whitening below is over the rows of all processes (ppo.whiten_scope: global) or of this one.
        reduce_sum = whitening_reducer(m.ppo.whiten_scope, m._trainer)
        scores = m.reward_cfg.shape(raw_scores, gen.ended, reduce_sum)  # (B,): one placement path for every source
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
            query_responses=gen.query_responses, attention_mask=gen.attention_mask,
            response_ids=gen.response_ids, response_mask=mask, ended=gen.ended,
            old_logprobs=scored.old_logprobs, ref_logprobs=scored.ref_logprobs,
            old_values=scored.old_values, raw_scores=raw_scores, scores=scores, kl=kl,
            rewards=rewards, advantages=advantages, returns=returns,
        )  # fmt: skip
        entropy = masked_mean(scored.entropy, mask)  # ()
        ensemble = scored.rm_scores is not None and scored.rm_scores.dim() == 2
        reward_std = member_std(scored.rm_scores) if ensemble else None  # (B,): for a watchdog reading disagreement
        sampled = self.uses_sampled_logprobs(gen)
        gen_train_diff = None
        if gen.logprobs is not None and not sampled:  # rescored: the rescore is the training pass's forward
            gen_train_diff = masked_mean((gen.logprobs - scored.old_logprobs).abs(), mask)  # ()
        return rollout, Experience(
            entropy, {k: v.mean() for k, v in reward_parts.items()}, texts, reward_std, sampled, gen_train_diff, first
        )

    def texts(self, rollout: Rollout, experience: Experience) -> list[str]:
        """The responses as a judge reads them, decoded now unless the reward functions did already."""
        if experience.texts is None:
            experience.texts = response_texts(
                self.module.tokenizer, rollout.query_responses, rollout.attention_mask, rollout.response_mask,
                rollout.ended,
            )  # fmt: skip
        return experience.texts


def judged_texts(maker: ExperienceMaker, rollout: Rollout, experience: Experience, reads: JudgeReads) -> list[str]:
    """What a judge reads of a rollout (:data:`~rlhf_lit.evaluation.judges.JudgeReads`): the responses,
    or each prompt as the policy read it (:func:`~rlhf_lit.evaluation.texts.prompt_texts`) + its response."""
    texts = maker.texts(rollout, experience)
    if reads == "response":
        return texts
    prompts = prompt_texts(maker.module.tokenizer, rollout.query_responses, rollout.attention_mask, rollout.prompt_length)
    return judge_texts(prompts, texts, reads)


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

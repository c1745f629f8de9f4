"""``PPOModule``: the PPO stage as a LightningModule (see :mod:`rlhf_lit.stages.ppo` for the method).

``training_step`` is the table of contents of one rollout; the work is done by the experience
maker (:mod:`~rlhf_lit.stages.ppo.experience`), the loss (:mod:`~rlhf_lit.stages.ppo.loss`) and the
update loop (:mod:`~rlhf_lit.stages.ppo.update`), which read of the module what
:mod:`~rlhf_lit.stages.ppo.protocols` names. The models, KL controller and optimizers are built by
:mod:`~rlhf_lit.stages.ppo.building`; the checkpoint and resume hooks are
:mod:`~rlhf_lit.stages.ppo.checkpointing`'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from rlhf_lit.evaluation import load_judge
from rlhf_lit.evaluation.judges import JudgeReads, judge_texts
from rlhf_lit.functional import sft_loss
from rlhf_lit.models.compiled_generation import compile_stats
from rlhf_lit.models.generation import Generated, SamplingConfig
from rlhf_lit.models.loading import AttnImplementation, DType, ModelLoading
from rlhf_lit.models.lora import LoRAConfig
from rlhf_lit.models.memory import MemoryConfig, call_on_own_device, train_mode
from rlhf_lit.models.packing import padding_free
from rlhf_lit.models.reward_ensemble import normalised_scores
from rlhf_lit.models.scoring import reward_model_rows
from rlhf_lit.models.teacher_forced import forward_with_positions, response_distributions
from rlhf_lit.models.value import CriticKind
from rlhf_lit.run_seed import seed_or_run_seed
from rlhf_lit.stages.amp import loss_scale
from rlhf_lit.stages.base import RunLayout, StageModule, as_config, require_input
from rlhf_lit.stages.export import SAMPLING_KEY, ExportExisting
from rlhf_lit.stages.optim import OptimizerConfig
from rlhf_lit.stages.ppo.building import build_models, build_optimizers, kl_controller, shard_stage_models
from rlhf_lit.stages.ppo.checkpointing import SAFE_ON_RESUME, PPOCheckpoints
from rlhf_lit.stages.ppo.checks import check_data_module, check_rollout_rows, check_settings, refusal_before_build
from rlhf_lit.stages.ppo.config import KLConfig, PPOConfig, RewardConfig
from rlhf_lit.stages.ppo.estimator import AdvantageEstimator
from rlhf_lit.stages.ppo.experience import ExperienceMaker, RolloutInfo, judged_scores, sample_responses
from rlhf_lit.stages.ppo.first_forward import reuses_first_forward
from rlhf_lit.stages.ppo.forward import ForwardPassRunner
from rlhf_lit.stages.ppo.loss import LossStats, ppo_loss
from rlhf_lit.stages.ppo.metrics import (
    RolloutTimer,
    compile_statistics,
    logged_metrics,
    reduce_over_ranks,
    rollout_statistics,
    text_statistics,
)
from rlhf_lit.stages.ppo.ranks import sum_over_ranks
from rlhf_lit.stages.ppo.reward_sources import RewardSources, reward_model_unused
from rlhf_lit.stages.ppo.rollout import Rollout, nonfinite_rollout_parts
from rlhf_lit.stages.ppo.seeding import STREAM_SAMPLE, stream_generator
from rlhf_lit.stages.ppo.update import cycle, rank_token_weight, train_on_rollout
from rlhf_lit.tokenizer import MissingPad


class PPOModule(PPOCheckpoints, StageModule):
    """PPO on a policy initialised from the SFT model, with a KL penalty to a frozen copy of it.

    Strategies: single device, ``ddp`` and ``fsdp`` / ``fsdp2`` (:mod:`rlhf_lit.strategies`: the
    four models are sharded in :meth:`configure_model`).

    Args:
        sft_model: the SFT model (hub name or directory): the policy's start and the reference.
            Required; with ``--run_dir`` it defaults to the run's SFT export (``RUN_DIR/sft/model``).
        reward_model: the reward model (an ``AutoModelForSequenceClassification`` with one label,
            e.g. the RM stage's export), or a reward-model ensemble directory (the RM stage's export
            with ``ensemble.members > 1``; its source's ``aggregate`` combines the members). Frozen;
            reloaded from this path on resume. Loaded only
            when a ``reward.sources`` entry is the reward model (the default); null otherwise
            (it may still be where a separate critic starts). With ``--run_dir`` and a source
            that is the reward model it defaults to the run's RM export (``RUN_DIR/reward_model/model``).
        value_model: where a separate critic starts; None = the reward model (N+ detail 16); for an
            ensemble, its member 0.
        tokenizer_path: the tokenizer; None = the SFT model's. The RM must share it.
        missing_pad: what to do if the tokenizer has no pad token (see ``load_tokenizer``).
        critic: ``separate`` value model or ``shared_trunk`` value head on the policy.
        dtype: weight dtype of all models (keep float32 with ``precision="bf16-mixed"``).
        revision: hub revision of ``sft_model`` (the policy, the reference, and the tokenizer when
            ``tokenizer_path`` is None); the reward and value models are read at their default revision
            (a revision names a commit of one repository).
        trust_remote_code: allow model code from the hub, for every model the stage loads.
        attn_implementation: the attention kernel of every model the stage loads (policy, reference,
            reward model or each ensemble member, critic), passed to ``from_pretrained`` (``eager``,
            ``sdpa``, ``flash_attention_2``, ...); None: transformers' default
            (:data:`~rlhf_lit.models.loading.AttnImplementation`).
        sampling: how responses are sampled.
        ppo: the PPO update.
        reward: the reward sources (reward model, ``module:function`` rewards) and how their
            weighted sum becomes the reward.
        kl: the KL penalty and its controller.
        optimizer: AdamW of the policy (and of the head with ``shared_trunk``); its schedule is
            stepped once per rollout (warmup and decay are counted in rollouts).
        critic_optimizer: AdamW of the separate critic; None = same as ``optimizer``. Must be
            None with ``shared_trunk`` (one optimizer).
        max_rollouts: rollouts to run; training stops after this many (also the schedule length).
        rollout_seed: base of the per-rank sampling and shuffling seeds (``seed + rank * 100003``);
            None: the run's ``seed_everything`` (:mod:`rlhf_lit.run_seed`), so another run seed
            samples other responses and shuffles other minibatches.
        judge: optional gold scorer (:func:`rlhf_lit.evaluation.load_judge`): ``"module:function"`` of a
            list of texts (e.g. ``rlhf_lit.evaluation.judges:vader``), reading the responses, or with
            ``judge_reads: query_response`` each prompt as the policy read it + its response; or the
            directory of a reward-model export (a gold reward model), scoring each prompt as the policy
            read it with its response, loaded in the frozen models' dtype, on the stage's device. Its
            batch mean is ``objective/judge``; never a reward.
        export_dir: where the trained policy and its tokenizer go at the end of fit, in Hugging Face
            format; None: ``<log dir>/model``.
        max_skipped_updates: updates in a row skipped for NaN or inf (a rollout with non-finite scores,
            logprobs or values; an optimizer step with non-finite gradients) that stop the run.
        export_existing: ``refuse`` or ``replace`` an earlier rlhf-lit export there
            (:class:`~rlhf_lit.stages.base.StageModule`).
        lora: LoRA adapters on the policy (:class:`~rlhf_lit.models.lora.LoRAConfig`; ``dropout``
            must be 0); None trains every weight. With LoRA the reference is the policy with its
            adapters disabled (no second copy of the SFT model is loaded) and the export writes the
            merged weights or the adapter (``lora.export``).
        critic_lora: LoRA adapters on a ``separate`` critic (its score head trains in full); None
            trains the whole critic. With ``shared_trunk`` the value head sits on the (LoRA) policy.
        memory: memory levers (:class:`~rlhf_lit.models.memory.MemoryConfig`): gradient
            checkpointing of policy and critic, the frozen reference and reward model on the CPU
            and/or in another dtype. ``ppo.score_chunk_size`` bounds the scoring passes' memory.
        trainable_layers: train only the top N transformer blocks of the policy and of a separate
            critic, and what follows them (final norm, score head; a shared-trunk value head always
            trains); embeddings, lower blocks and a tied LM head stay frozen
            (:mod:`rlhf_lit.models.freezing`). None trains every weight; refused with LoRA.
        cache_frozen: keep, for each rollout, every row's output of the frozen blocks below
            ``trainable_layers`` (:mod:`rlhf_lit.models.trunk_cache`): policy, reference, critic and
            reward model (those with the same frozen weights share it) run it once per row, and the
            update's epochs run only the top blocks. Needs ``trainable_layers``; eager passes only.
        frozen_modules: modules of the policy kept frozen inside what trains, each a module's full name
            or a dotted suffix of it (``layers.29.mlp``: the top block's MLP of a 30-block Llama; the chat
            demo measured most of PPO's KL in the top block; :func:`~rlhf_lit.models.freezing.freeze_modules`); a
            separate critic trains its top blocks whole. Refused beside LoRA.
    """

    SAFE_ON_RESUME = SAFE_ON_RESUME
    SEED_OPTIONS = ("rollout_seed",)
    FROZEN_PREFIXES = ("ref_policy.", "reward_model.")  # the frozen models (StageModule.FROZEN_PREFIXES)
    EXPORT_WHAT = "PPO policy"
    refusal_before_build = classmethod(refusal_before_build)  # max_steps; compiled passes under FSDP (checks.py)
    run_layout = RunLayout(  # --run_dir: RUN_DIR/ppo/, inputs from the run's sft and reward_model exports
        "ppo", inputs={"sft_model": "sft", "reward_model": "reward_model"}, skip_input=reward_model_unused
    )

    def __init__(
        self,
        sft_model: str | None = None,
        reward_model: str | None = None,
        value_model: str | None = None,
        tokenizer_path: str | None = None,
        missing_pad: MissingPad = "add",
        critic: CriticKind = "separate",
        dtype: DType = "float32",
        revision: str | None = None,
        trust_remote_code: bool = False,
        attn_implementation: AttnImplementation = None,
        sampling: SamplingConfig = SamplingConfig(),
        ppo: PPOConfig = PPOConfig(),
        reward: RewardConfig = RewardConfig(),
        kl: KLConfig = KLConfig(),
        optimizer: OptimizerConfig = OptimizerConfig(lr=1e-5, eps=1e-5),
        critic_optimizer: OptimizerConfig | None = None,
        max_rollouts: int = 1000,
        rollout_seed: int | None = None,
        judge: str | None = None,
        judge_reads: JudgeReads = "response",
        export_dir: str | None = None,
        export_existing: ExportExisting = "refuse",
        max_skipped_updates: int = 3,
        lora: LoRAConfig | None = None,
        critic_lora: LoRAConfig | None = None,
        memory: MemoryConfig = MemoryConfig(),
        trainable_layers: int | None = None,
        cache_frozen: bool = False,
        frozen_modules: list[str] | None = None,
    ) -> None:
        super().__init__()
        require_input(sft_model, "sft_model", "the SFT model")
        judge_texts([], [], judge_reads)  # an unknown judge_reads fails here, before any model loads
        self.judge_reads = judge_reads
        self.memory: MemoryConfig = as_config(MemoryConfig, memory)
        # Loaded first: a bad spec fails before any model is. A reward-model judge is loaded as the frozen
        # models are (their dtype, the attention kernel) and scores on the stage's device.
        loading = ModelLoading(self.memory.frozen_dtype or dtype, None, trust_remote_code, attn_implementation)
        self.judge = None if judge is None else load_judge(judge, loading)
        self.sampling: SamplingConfig = as_config(SamplingConfig, sampling)
        self.ppo: PPOConfig = as_config(PPOConfig, ppo)
        self.reward_cfg: RewardConfig = as_config(RewardConfig, reward)
        self.kl_cfg: KLConfig = as_config(KLConfig, kl)
        self.reward_sources = RewardSources(self.reward_cfg.sources)  # a bad function spec fails here
        self.optimizer_cfg = as_config(OptimizerConfig, optimizer)
        self.critic_optimizer_cfg = as_config(OptimizerConfig, critic_optimizer)
        self.lora_cfg = as_config(LoRAConfig, lora)
        self.critic_lora_cfg = as_config(LoRAConfig, critic_lora)
        # The one place the estimator is chosen: it decides whether a critic exists at all.
        self.estimator = AdvantageEstimator(self.ppo, self.sampling.samples_per_prompt)
        # Resolved now: LightningCLI has called seed_everything before it builds the stage.
        self.max_rollouts, self.rollout_seed = max_rollouts, seed_or_run_seed(rollout_seed)
        self.keep_settings(
            sampling=self.sampling,
            ppo=self.ppo,
            reward=self.reward_cfg,
            kl=self.kl_cfg,
            optimizer=self.optimizer_cfg,
            critic_optimizer=self.critic_optimizer_cfg,
            lora=self.lora_cfg,
            critic_lora=self.critic_lora_cfg,
            memory=self.memory,
        )
        check_settings(self)  # what contradicts itself, refused before any model loads
        self.keep_export(export_dir, export_existing, max_skipped_updates)
        self.automatic_optimization = False
        build_models(self)
        self.kl_ctl = kl_controller(self.kl_cfg)
        self.forward_passes = ForwardPassRunner(self.ppo.forward)  # ppo.forward: eager or compiled
        self.experience_maker = ExperienceMaker(self)
        self.rollout_index = 0  # rollouts completed; the step of every logged metric
        # The last rollout's logged metrics (averaged over ranks, the same on every rank): what
        # callbacks that act on them read (rlhf_lit.callbacks.OverOptimisationGuard).
        self.last_rollout_metrics: dict[str, float] = {}
        self._ptx_batches: Iterator[dict[str, torch.Tensor]] | None = None

    @property
    def trained_models(self) -> list[torch.nn.Module]:
        """The policy, and the critic when the estimator has one."""
        return [m for m in (self.policy, self.critic) if m is not None]

    def export_facts(self) -> dict[str, Any]:
        """How the policy sampled in training, which ``rlhf-lit evaluate`` and ``best-of-n`` sample with unless
        told otherwise (:data:`~rlhf_lit.stages.export.SAMPLING_KEY`)."""
        keys = ("max_new_tokens", "temperature", "top_k", "top_p", "draw")
        return {SAMPLING_KEY: {k: getattr(self.sampling, k) for k in keys}}

    def trained_model(self) -> torch.nn.Module:
        """The policy: what the export writes."""
        return self.policy

    # ------------------------------------------------------------------ setup
    def configure_model(self) -> None:
        """Shard policy, critic, reference and reward model under FSDP (no-op otherwise;
        :func:`~rlhf_lit.stages.ppo.building.shard_stage_models`)."""
        shard_stage_models(self, getattr(self, "_device_mesh", None) is not None)

    def frozen_submodules(self) -> dict[str, torch.nn.Module]:
        """The frozen models registered as submodules: the reference copy and the reward model (none
        with LoRA's adapter-disabled reference, or kept on the CPU: ``memory.frozen_device``)."""
        return {name: self._modules[name] for name in ("ref_policy", "reward_model") if name in self._modules}

    def configure_optimizers(self):
        """Policy and critic optimizers (one with ``shared_trunk`` or without a critic), schedules
        stepped per rollout (:func:`~rlhf_lit.stages.ppo.building.build_optimizers`)."""
        return build_optimizers(self)

    def optimizer_list(self) -> list:
        """The Lightning-wrapped optimizers as a list (one or two)."""
        optimizers = self.optimizers()
        return optimizers if isinstance(optimizers, list) else [optimizers]

    def check_before_fit(self) -> None:
        """Refuse, before any work is done, a data module this run cannot use
        (:func:`~rlhf_lit.stages.ppo.checks.check_data_module`)."""
        check_data_module(self)

    def stream_generator(self, stream: int) -> torch.Generator:
        """A generator for (seed, rank, rollout, stream) (:mod:`~rlhf_lit.stages.ppo.seeding`)."""
        return stream_generator(self.rollout_seed, self.global_rank, self.rollout_index, stream)

    # ------------------------------------------------------------------ the step
    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        """One rollout and its PPO update; stops the trainer after ``max_rollouts``."""
        if self.rollout_index >= self.max_rollouts:
            self.trainer.should_stop = True
            return
        rows = batch["input_ids"].shape[0] * self.sampling.samples_per_prompt
        if self.trunk_caches is not None:
            self.trunk_caches.clear()  # the last rollout's rows are never read again
        check_rollout_rows(rows, self.ppo, self.sampling.samples_per_prompt)  # before any work
        timer = RolloutTimer(self.device)
        with padding_free(self.ppo.remove_padding):  # generate, score (+ the update's first forward), advantages
            rollout, info = self.make_rollout(batch, timer, reuses_first_forward(self.ppo, self.critic is not None))
        bad = nonfinite_rollout_parts(rollout, sum_over_ranks(self.trainer))
        if bad:  # no update on NaN: it would turn every weight into NaN
            self.nonfinite.skipped("rollout", f"rollout {self.rollout_index}: non-finite {', '.join(bad)}")
            self._end_rollout(rollout.batch_size, {"skipped/nonfinite_rollout": 1.0})
            return
        with train_mode(*self.trained_models), padding_free(self.ppo.remove_padding):  # (checkpointing; no dropout)
            train_stats = train_on_rollout(self, rollout, info.first_forward)
        timer.mark("train")
        kl_coef = self.kl_ctl.value
        metrics = self.rollout_metrics(rollout, info, train_stats, kl_coef, timer)
        if self.trunk_caches is not None:  # rows read and computed so far, bytes kept for this rollout
            metrics.update({f"trunk_cache/{k}": v for k, v in self.trunk_caches.statistics().items()})
        # The KL controller sees the KL averaged over all ranks and the global batch size.
        self.kl_ctl.update(metrics["objective/kl"], n_steps=rollout.batch_size * self.trainer.world_size)
        self.log_dict(
            {"score": metrics["objective/scores"], "kl": metrics["objective/kl"]}, prog_bar=True, logger=False
        )
        self._end_rollout(rollout.batch_size, {**metrics, "skipped/nonfinite_rollout": 0.0})

    def _end_rollout(self, rows: int, metrics: dict[str, float]) -> None:
        """Log the rollout, count it, advance the data position and the schedules, stop at the end."""
        self.last_rollout_metrics = metrics
        for logger in self.loggers:  # step = rollout index, not global_step (which counts opt steps)
            logger.log_metrics(metrics, step=self.rollout_index)
        self.rollout_index += 1
        datamodule = getattr(self.trainer, "datamodule", None)
        if hasattr(datamodule, "mark_consumed"):
            # The prompts of every rank (k rows each): the data position is global (see the package docstring).
            datamodule.mark_consumed(rows // self.sampling.samples_per_prompt * self.trainer.world_size)
        schedulers = self.lr_schedulers()
        for scheduler in schedulers if isinstance(schedulers, list) else [schedulers]:
            scheduler.step()
        if self.rollout_index >= self.max_rollouts:
            self.trainer.should_stop = True

    # ------------------------------------------------------------------ rollout and update
    def make_rollout(
        self, batch: dict, timer: RolloutTimer | None, reuse_first_forward: bool = False
    ) -> tuple[Rollout, RolloutInfo]:
        """Generate, score, shape rewards and compute advantages (:meth:`ExperienceMaker.make`)."""
        return self.experience_maker.make(batch, timer, reuse_first_forward, self._trainer)

    def generate(self, batch: dict[str, torch.Tensor]) -> Generated:
        """Sample responses to the prompts of ``batch``
        (:func:`~rlhf_lit.stages.ppo.experience.sample_responses`)."""
        return sample_responses(self.policy, batch, self, self.stream_generator(STREAM_SAMPLE))

    def score(self, query_responses: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The RM's normalised score ``(B,)``, an ensemble's ``(B, M)``
        at the last attended token, the normalisation bias an exported RM could not fold into its weights
        added (:func:`~rlhf_lit.models.reward_ensemble.normalised_scores`), on the reward model's own device."""
        return call_on_own_device(normalised_scores, self.reward_model, query_responses, attention_mask)

    def reward_model_inputs(self, gen: Generated) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows the reward model reads: as sampled, or with ``response_end_id`` (the EOS, or a chat template's
        end of turn) after unfinished responses (``reward.unfinished``, :data:`~rlhf_lit.models.scoring.UnfinishedScoring`)."""
        return reward_model_rows(gen, self.reward_cfg.unfinished, self.response_end_id, self.tokenizer.pad_token_id)

    def minibatch_loss(self, mb: Rollout, passes: tuple | None = None) -> tuple[torch.Tensor, LossStats]:
        """:func:`~rlhf_lit.stages.ppo.loss.ppo_loss` of the policy (and critic) now, as this rank's share
        of the token mean over all ranks, plus ``ptx_coef`` * the SFT loss of a second-source batch.
        ``passes``: the minibatch's ``(logits, values)`` computed already (a :class:`FirstForward`)."""
        logits, values = passes or self.forward_passes.policy_and_values(
            self.policy, self.critic, mb.query_responses, mb.attention_mask, mb.prompt_length
        )  # (B, R, V), (B, R) or None
        temperature = self.sampling.temperature
        ref_distributions = None
        if self.kl_cfg.mode == "loss" and self.kl_cfg.loss_estimator == "exact":
            ref_distributions = self.reference.apply(
                response_distributions, mb.query_responses, mb.attention_mask, mb.prompt_length, temperature
            )  # (B, R, V), no gradient
        # beta is the rollout's: the controller updates after the update
        loss, stats = ppo_loss(
            mb, logits, values, self.ppo, temperature, self.kl_cfg, self.kl_ctl.value, ref_distributions
        )
        loss = loss * rank_token_weight(mb.response_mask, self._trainer)  # (): a token mean over every rank's minibatch
        ptx = torch.zeros((), device=self.device)  # ()
        if self.ppo.ptx_coef > 0:
            batch = self._next_ptx_batch()
            ptx_logits = forward_with_positions(self.policy, batch["input_ids"], batch["attention_mask"]).logits
            ptx = sft_loss(ptx_logits, batch["labels"])  # ()
            loss = loss + self.ppo.ptx_coef * ptx  # ()
        return loss, LossStats({**stats.logged, "loss/ptx": ptx.detach()}, stats.old_logprob_diff)

    def _next_ptx_batch(self) -> dict[str, torch.Tensor]:
        """The next SFT-style batch of the second data source, cycling through it."""
        if self._ptx_batches is None:
            self._ptx_batches = cycle(self.trainer.datamodule.ptx_dataloader())
        # non_blocking: the host does not wait for the copy (no stall once per minibatch).
        return {k: v.to(self.device, non_blocking=True) for k, v in next(self._ptx_batches).items()}

    def on_before_optimizer_step(self, optimizer) -> None:
        """Skip a step with non-finite gradients; clip the gradient norm to ``ppo.max_grad_norm``.

        Here, not before ``opt.step()``: Lightning calls this hook after it unscales fp16
        (``16-mixed``) gradients, so the clip sees true gradients, not ones times the loss scale.
        """
        kind = ("the policy", "the critic")[self.trainer.optimizers.index(optimizer)]
        if self.hparams.critic == "shared_trunk":
            kind = "the policy and value head"
        where = f"rollout {self.rollout_index}, optimizer step {self.global_step}"
        if not self.nonfinite.check_optimizer(optimizer, kind, where, loss_scale(self.trainer), self.any_rank):
            return  # gradients dropped, or fp16: the GradScaler skips this optimizer's step
        if self.ppo.max_grad_norm is not None:
            self.clip_gradients(optimizer, gradient_clip_val=self.ppo.max_grad_norm, gradient_clip_algorithm="norm")

    # ------------------------------------------------------------------ metrics
    def rollout_metrics(
        self, rollout: Rollout, info: RolloutInfo, train_stats: LossStats, kl_coef: float, timer: RolloutTimer
    ) -> dict[str, float]:
        """Everything logged for a rollout, averaged over ranks (see :mod:`rlhf_lit.stages.ppo.metrics`).

        Distinct-n reads the responses, decoded once per rollout; the judge what ``judge_reads`` says.
        ``kl_coef`` is the coefficient the rollout's rewards were shaped with.
        """
        # The generation / training mismatch: a rescored rollout measured it against the rescore;
        # with the recorded old logprobs, the update's forward before its first step measured it.
        gen_train_diff = train_stats.old_logprob_diff if info.old_logprobs_sampled else info.gen_train_diff
        local = rollout_statistics(
            rollout,
            info.entropy,
            train_stats.logged,
            kl_coef,
            self.critic is not None,
            gen_train_diff,
            kl_mode=self.kl_cfg.mode,
        )  # no sync
        local.update(info.reward_parts)  # each source
        # The share of scores the missing-EOS penalty replaced: what no reward-model signal reaches.
        replaced = ~rollout.ended if self.reward_cfg.missing_eos_penalty is not None else rollout.ended & False
        local["objective/replaced_fraction"] = replaced.float().mean()
        maker = self.experience_maker
        judged = None if self.judge is None else judged_scores(maker, rollout, info, self.judge, self.judge_reads)
        local.update(text_statistics(maker.texts(rollout, info), judged))
        local.update(compile_statistics("decode", self.sampling.decode, compile_stats()))  # none when eager
        local.update(compile_statistics("forward", self.ppo.forward, self.forward_passes.stats))
        timer.mark("text")
        reduced = reduce_over_ranks(self.trainer.strategy, local, self.device)
        learning_rates = [opt.param_groups[0]["lr"] for opt in self.optimizer_list()]
        return logged_metrics(reduced, timer, learning_rates, kl_coef, rollout.batch_size * self.trainer.world_size)

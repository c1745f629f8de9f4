"""PPO with a per-token KL penalty to the frozen SFT model: the third InstructGPT stage.

One ``training_step`` is one rollout: generate -> score -> rewards -> GAE -> K epochs of clipped
updates -> KL controller -> metrics. Manual optimization; the module owns the whole update.

Implementation details followed (N = "The N Implementation Details of RLHF with PPO", Huang et
al. 2022 blog; N+ = "The N+ Implementation Details of RLHF with PPO", Huang et al. 2024):

- Reward = RM score at the last response token (EOS included) plus ``-beta * KL`` per token
  (Ziegler et al. 2019; Ouyang et al. 2022; N #10). RM and critic read query + response (N #1).
  With ``kl.mode: loss`` the KL is a loss term instead (GRPO, Shao et al. 2024: k3, token mean).
- Stop at EOS; tokens after the first EOS are set to pad and masked (N+ / N #3). "EOS" is every
  stop id of the policy (:func:`~rlhf_lit.models.generation.stop_token_ids`: the tokenizer's and
  the ``generation_config`` list chat models carry), for sampling, masks, the RM score position
  and the missing-EOS penalty alike. Masks come from
  EOS positions, never from pad ids; ``position_ids = cumsum(mask) - 1`` in every forward pass so
  left-padded rows see the positions ``generate`` used (N #2).
- Logits are divided by the sampling temperature whenever logprobs are computed (N #7), so the
  ratio is exactly 1 on the first minibatch.
- Dropout off in policy, reference, RM and critic (N #8; done by the loaders, and it stays off in
  train mode: ``nn.Dropout`` modules and the attention dropout rates Llama-family code reads).
- Missing-EOS penalty replaces the score (N+ / N #9); optional score bias, whitening, clipping,
  and TRL-style reward whitening without re-centring (N #5, #12).
- Adaptive KL controller (Ziegler et al. 2019; N #11: error clipped to +-0.2) or fixed (N+), fed
  with the KL per response (summed over tokens) averaged over all ranks, and the global sample
  count. Its target is in nats, so it takes only the ``k1`` / ``k3`` estimators.
- GAE with gamma 1, lambda 0.95 by default; advantages whitened over the batch (N #12; cleanrl).
- Clipped value loss, vf_coef 0.1 (N #13); the critic is a separate model initialised from the
  RM (N+ #16) with a zeroed head when new (N #4), or a zeroed head on the policy's trunk. A
  critic from an RM whose normalisation bias lives in ``config.reward_bias`` (Llama) adds it to
  every value, as the reward does, so its last-token value starts equal to the reward.
- Adam eps configurable (N #15: PyTorch placement; default 1e-5 as in cleanrl / N+).
- Per-process seeds ``seed + rank * 100003`` (N #14), folded with the rollout index and a stream
  id into fresh generators, so sampling and shuffling are reproducible and resume exactly.
- Optional entropy bonus (cleanrl) and PPO-ptx (Ouyang et al. 2022, eq. 2).
- ``ppo.estimator`` (:mod:`rlhf_lit.stages.advantage`, the one place it is read): ``gae`` above,
  or critic-free GRPO (Shao et al. 2024), Dr. GRPO (Liu et al. 2025), RLOO (Ahmadian et al.
  2024) and REINFORCE++ (Hu 2025), which build no critic and have one optimizer. With
  ``sampling.samples_per_prompt = k`` each prompt is repeated k times as consecutive rows before
  generation (TRL's layout); the group estimators score the sequence reward ``rewards.sum(1)``.

Departures from textbook PPO (Schulman et al. 2017) and their reasons:

- The "environment" is one response; the value of the state before token t is read at position
  ``P - 1 + t`` and the episode ends after the last response token (value 0), as in TRL / N+.
- Data position: after each rollout ``trainer.datamodule.mark_consumed(B * world_size)`` (when the
  data module has it); Lightning stores ``datamodule.state_dict()`` in checkpoints and restores it
  before the train loader is built, so a resumed run continues with the prompts not yet used
  (tested across an epoch boundary). The rollout counter, the KL controller and the global RNG go
  in ``checkpoint["ppo"]``; sampling and shuffling seeds are folded from (seed, rank, rollout).
- Logprobs use the full softmax even with top-k / top-p sampling (as TRL, OpenRLHF): ratio 1
  still holds, the importance weight is of the untruncated policy.
- Losses are token means over a minibatch (cleanrl / TRL), not per-sequence means; with several
  processes, over the tokens of that minibatch on every rank (a rank with short responses does not
  weigh more). Advantage and score whitening use each rank's batch, as TRL does.
- The learning-rate schedule is stepped once per rollout (``warmup_steps`` and the decay count
  rollouts), not per optimizer step. Lightning's ``global_step`` counts every ``opt.step()``
  (of both optimizers), so this module keeps ``rollout_index`` and stops with ``max_rollouts``
  (``trainer.should_stop``); metrics are logged with ``step = rollout_index``.
- REINFORCE++ whitens its returns over each rank's batch (as GAE advantages here), not over the
  global batch of all ranks as the paper does.
- With ``critic="shared_trunk"`` there is one optimizer (policy and head parameters together);
  with ``separate`` two (policy, critic). Gradient accumulation divides each minibatch loss by
  ``grad_accum``; one ``manual_backward`` on the summed loss per minibatch (DDP sees every
  parameter).
- fp16 (``16-mixed``) with two optimizers: the loss scale is updated once after both stepped
  (PyTorch's AMP recipe for several optimizers), not after each as Lightning's plugin would, so
  the critic's gradients are unscaled with the scale they were scaled with
  (:mod:`rlhf_lit.stages.amp`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import torch
from lightning.pytorch import LightningModule

from rlhf_lit.evaluation import load_judge, response_texts
from rlhf_lit.functional import (
    AdaptiveKLController,
    FixedKLController,
    clipped_value_loss,
    entropy_from_logits,
    kl_loss,
    kl_penalized_rewards,
    masked_mean,
    masked_whiten,
    ppo_policy_loss,
    sft_loss,
    token_logprobs,
)
from rlhf_lit.models import load_causal_lm, load_reward_model, sequence_scores
from rlhf_lit.models.reward_norm import reward_offset
from rlhf_lit.models.scoring import reward_model_rows
from rlhf_lit.models.generation import (
    Generated,
    SamplingConfig,
    forward_with_positions,
    generate_responses,
    forward_response_logits,
    stop_token_ids,
)
from rlhf_lit.models.loading import DType
from rlhf_lit.models.lora import LoRAConfig, exportable, with_lora
from rlhf_lit.models.memory import MemoryConfig, attach_frozen, call_on_own_device, enable_gradient_checkpointing, train_mode
from rlhf_lit.models.reference import build_reference
from rlhf_lit.models.sharding import gathered_for_generation, is_sharded, reshard, shard_models
from rlhf_lit.models.value import CriticKind, build_critic
from rlhf_lit.rollout import Rollout, minibatches
from rlhf_lit.stages.base import RunLayout
from rlhf_lit.sources import source_fingerprint
from rlhf_lit.stages.advantage import AdvantageEstimator, repeat_prompts
from rlhf_lit.stages.amp import has_gradient_scaler, one_scaler_update
from rlhf_lit.stages.export import ExportExisting, check_export_at_fit_start, export_at_fit_end
from rlhf_lit.stages.dataclass_args import as_config
from rlhf_lit.stages.nonfinite import NonFiniteGuard, assert_finite, nonfinite_rollout_parts
from rlhf_lit.stages.optim import OptimizerConfig, build_optimizer, fused_adamw_supported
from rlhf_lit.stages.precision import warn_if_slow_precision
from rlhf_lit.stages.ppo_config import KLConfig, PPOConfig, RewardConfig
from rlhf_lit.stages.resume import check_loaded_keys, check_module_resume
from rlhf_lit.stages.reward_sources import RewardSources, reward_batch
from rlhf_lit.stages.ppo_metrics import (
    RolloutTimer,
    logged_metrics,
    reduce_over_ranks,
    rollout_statistics,
    text_statistics,
)
from rlhf_lit.tokenizer import MissingPad, check_same_vocabulary, load_tokenizer

SAFE_ON_RESUME = ("max_rollouts", "judge", "export_dir", "export_existing", "max_skipped_updates")
"""Settings a resume may change: how far the run goes, what is logged beside it, where it exports."""
STREAM_SAMPLE, STREAM_SHUFFLE = 0, 1
"""Random streams folded into the per-rollout seeds."""


def reward_model_unused(arg: str, init_args) -> bool:
    """``--run_dir`` leaves ``reward_model`` unset when no ``reward.sources`` entry is the reward model."""
    if arg != "reward_model":
        return False
    reward = init_args.get("reward")
    reward = reward.as_dict() if hasattr(reward, "as_dict") else dict(reward or {})
    sources = reward.get("sources") or [{"function": None}]  # the default source is the reward model
    return all(dict(source).get("function") is not None for source in sources)


def freeze(model: torch.nn.Module) -> torch.nn.Module:
    """No gradients, eval mode: for the reference and the reward model."""
    model.requires_grad_(False)
    return model.eval()


class PPOModule(LightningModule):
    """PPO on a policy initialised from the SFT model, with a KL penalty to a frozen copy of it.

    Strategies: single device, ``ddp`` and ``fsdp`` / ``fsdp2`` (:mod:`rlhf_lit.strategies`: the
    four models are sharded in :meth:`configure_model`).

    Args:
        sft_model: the SFT model (hub name or directory): the policy's start and the reference.
            Required; with ``--run_dir`` it defaults to the run's SFT export (``RUN_DIR/sft/model``).
        reward_model: the reward model (an ``AutoModelForSequenceClassification`` with one label,
            e.g. the RM stage's export). Frozen; reloaded from this path on resume. Loaded only
            when a ``reward.sources`` entry is the reward model (the default); null otherwise
            (it may still be where a separate critic starts). With ``--run_dir`` and a source
            that is the reward model it defaults to the run's RM export (``RUN_DIR/rm/model``).
        value_model: where a separate critic starts; None = the reward model (N+ #16).
        tokenizer_path: the tokenizer; None = the SFT model's. The RM must share it.
        missing_pad: what to do if the tokenizer has no pad token (see ``load_tokenizer``).
        critic: ``separate`` value model or ``shared_trunk`` value head on the policy.
        dtype: weight dtype of all models (keep float32 with ``precision="bf16-mixed"``).
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
        rollout_seed: base of the per-rank sampling and shuffling seeds (``seed + rank * 100003``).
        judge: optional gold scorer ``"module:function"`` of a list of response texts (e.g.
            ``rlhf_lit.evaluation.judges:vader``), loaded with
            :func:`rlhf_lit.evaluation.load_judge`. It reads the response only, decoded without
            special tokens as ``rlhf_lit.demo.evaluate`` does; its mean over the rollout batch is
            logged as ``objective/judge``. Never used as a reward.
        export_dir: where the trained policy and its tokenizer are written in Hugging Face format
            at the end of fit (``AutoModelForCausalLM.from_pretrained(export_dir)``); None means
            ``<log dir or default_root_dir>/model``.
        max_skipped_updates: stop the run after this many updates in a row were skipped for NaN or
            inf (a rollout with non-finite scores, logprobs or values; an optimizer step with
            non-finite gradients); see :mod:`rlhf_lit.stages.nonfinite`.
        export_existing: when ``export_dir`` already holds an earlier rlhf-lit export: ``refuse``
            (stop before training) or ``replace`` it (atomically, at the end of fit). A non-empty
            directory rlhf-lit did not write is never replaced.
        lora: LoRA adapters on the policy (:class:`~rlhf_lit.models.lora.LoRAConfig`; ``dropout``
            must be 0); None trains every weight. With LoRA the reference is the policy with its
            adapters disabled (no second copy of the SFT model is loaded) and the export writes the
            merged weights or the adapter (``lora.export``).
        critic_lora: LoRA adapters on a ``separate`` critic (its score head trains in full); None
            trains the whole critic. With ``shared_trunk`` the value head sits on the (LoRA) policy.
        memory: memory levers (:class:`~rlhf_lit.models.memory.MemoryConfig`): gradient
            checkpointing of policy and critic, the frozen reference and reward model on the CPU
            and/or in another dtype. ``ppo.score_chunk_size`` bounds the scoring passes' memory.
    """

    FROZEN_PREFIXES = ("ref_policy.", "reward_model.")
    """State-dict prefixes of the frozen models: never written to checkpoints, reloaded from paths."""

    run_layout = RunLayout(  # --run_dir: RUN_DIR/ppo/, inputs from the run's sft and rm exports
        "ppo", inputs={"sft_model": "sft", "reward_model": "rm"}, skip_input=reward_model_unused
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
        sampling: SamplingConfig = SamplingConfig(),
        ppo: PPOConfig = PPOConfig(),
        reward: RewardConfig = RewardConfig(),
        kl: KLConfig = KLConfig(),
        optimizer: OptimizerConfig = OptimizerConfig(lr=1e-5, eps=1e-5),
        critic_optimizer: OptimizerConfig | None = None,
        max_rollouts: int = 1000,
        rollout_seed: int = 0,
        judge: str | None = None,
        export_dir: str | None = None,
        export_existing: ExportExisting = "refuse",
        max_skipped_updates: int = 3,
        lora: LoRAConfig | None = None,
        critic_lora: LoRAConfig | None = None,
        memory: MemoryConfig = MemoryConfig(),
    ) -> None:
        super().__init__()
        if sft_model is None:  # None in the signature only so that --run_dir can supply it (rlhf_lit.runs)
            raise ValueError("sft_model is not set: give the SFT model, or --run_dir of a run whose SFT stage has finished")
        # Loaded first: a bad spec fails before any model is.
        self.judge = None if judge is None else load_judge(judge)
        self.sampling: SamplingConfig = as_config(SamplingConfig, sampling)
        self.ppo: PPOConfig = as_config(PPOConfig, ppo)
        self.reward_cfg: RewardConfig = as_config(RewardConfig, reward)
        self.kl_cfg: KLConfig = as_config(KLConfig, kl)
        self.reward_sources = RewardSources(self.reward_cfg.sources)  # a bad function spec fails here
        if self.sampling.ignore_eos and self.reward_cfg.missing_eos_penalty is not None:
            raise ValueError("sampling.ignore_eos: no response ends at EOS, so reward.missing_eos_penalty would hit "
                             "every one; leave it null")
        if self.reward_cfg.uses_reward_model and reward_model is None:
            raise ValueError("reward.sources uses the reward model (a source with function: null); set model.reward_model")
        self.optimizer_cfg = as_config(OptimizerConfig, optimizer)
        self.critic_optimizer_cfg = None if critic_optimizer is None else as_config(OptimizerConfig, critic_optimizer)
        self.lora_cfg = None if lora is None else as_config(LoRAConfig, lora)
        self.critic_lora_cfg = None if critic_lora is None else as_config(LoRAConfig, critic_lora)
        self.memory: MemoryConfig = as_config(MemoryConfig, memory)
        for what, cfg in (("lora", self.lora_cfg), ("critic_lora", self.critic_lora_cfg)):
            if cfg is not None and cfg.dropout != 0.0:
                raise ValueError(f"{what}.dropout must be 0 in PPO: old and new logprobs must agree before an update")
        if critic == "shared_trunk" and critic_lora is not None:
            raise ValueError("critic_lora applies to a separate critic; with critic='shared_trunk' leave it null")
        if critic == "shared_trunk" and critic_optimizer is not None:
            raise ValueError("critic='shared_trunk' trains the head with the policy's optimizer; leave critic_optimizer null")
        if max_rollouts < 1:
            raise ValueError(f"max_rollouts must be >= 1, got {max_rollouts}")
        # The one place the estimator is chosen: it decides whether a critic exists at all.
        self.estimator = AdvantageEstimator(
            self.ppo.estimator, self.sampling.samples_per_prompt, self.ppo.gamma, self.ppo.lam,
            self.ppo.whiten_advantages,
        )  # fmt: skip
        if not self.estimator.uses_critic:
            critic_settings = {"critic": critic != "separate", "value_model": value_model is not None,
                               "critic_lora": critic_lora is not None, "critic_optimizer": critic_optimizer is not None}  # fmt: skip
            if any(critic_settings.values()):
                given = ", ".join(k for k, v in critic_settings.items() if v)
                raise ValueError(f"ppo.estimator={self.ppo.estimator!r} trains no critic; leave {given} at the default")
        self.max_rollouts, self.rollout_seed = max_rollouts, rollout_seed
        # The settings as given (under LightningCLI with its class path, so `--ckpt_path` resumes from
        # the command line); the config groups as plain dicts: a dataclass breaks weights_only loading.
        groups = ("sampling", "ppo", "reward", "kl", "optimizer", "critic_optimizer", "lora", "critic_lora", "memory")
        self.save_hyperparameters(ignore=list(groups))
        self.hparams.update({
            "sampling": asdict(self.sampling), "ppo": asdict(self.ppo), "reward": asdict(self.reward_cfg),
            "kl": asdict(self.kl_cfg), "optimizer": asdict(self.optimizer_cfg),
            "critic_optimizer": None if self.critic_optimizer_cfg is None else asdict(self.critic_optimizer_cfg),
            "lora": None if self.lora_cfg is None else asdict(self.lora_cfg),
            "critic_lora": None if self.critic_lora_cfg is None else asdict(self.critic_lora_cfg),
            "memory": asdict(self.memory),
        })  # fmt: skip
        self.nonfinite = NonFiniteGuard(max_skipped_updates, "max_skipped_updates")
        self.export_dir, self.export_existing = export_dir, export_existing
        self.exported_path: Path | None = None
        self.automatic_optimization = False

        self.tokenizer = load_tokenizer(
            tokenizer_path or sft_model, padding_side="left", missing_pad=missing_pad,
            what="tokenizer_path" if tokenizer_path else "sft_model",
        )
        self.policy = with_lora(load_causal_lm(sft_model, self.tokenizer, dtype=dtype), self.lora_cfg, "causal_lm")
        # Every id that ends a response (the model may list several): sampling, masks, the reward
        # position and the missing-EOS penalty all follow from this one set.
        self.stop_ids = stop_token_ids(self.policy, self.tokenizer)
        base_vocab = self.policy.config.vocab_size
        for what, path in (("reward_model", reward_model), ("value_model", value_model)):
            if path is not None:  # before loading: a mismatched RM would be resized to fit silently
                check_same_vocabulary(self.tokenizer, path, what, base_vocab)
        frozen_dtype, frozen_device = self.memory.frozen_dtype or dtype, self.memory.frozen_device

        def frozen_sft_copy() -> torch.nn.Module:  # only without LoRA: see build_reference
            attach_frozen(self, "ref_policy", freeze(load_causal_lm(sft_model, self.tokenizer, dtype=frozen_dtype)), frozen_device)
            return self.ref_policy

        self.reference = build_reference(self.policy, frozen_sft_copy)
        if self.reward_cfg.uses_reward_model:
            rm = freeze(load_reward_model(reward_model, self.tokenizer, dtype=frozen_dtype))
            attach_frozen(self, "reward_model", rm, frozen_device)
        if self.estimator.uses_critic and critic == "separate" and (value_model or reward_model) is None:
            raise ValueError("a separate critic starts from value_model or reward_model; set one of them")
        self.critic = (
            build_critic(critic, self.policy, value_model or reward_model, self.tokenizer, dtype, self.critic_lora_cfg)
            if self.estimator.uses_critic else None
        )  # fmt: skip
        if self.memory.gradient_checkpointing:
            enable_gradient_checkpointing(*self.trained_models)
        if self.kl_cfg.kind == "adaptive":
            self.kl_ctl = AdaptiveKLController(self.kl_cfg.init_coef, self.kl_cfg.target, self.kl_cfg.horizon)
        else:
            self.kl_ctl = FixedKLController(self.kl_cfg.init_coef)
        self.rollout_index = 0  # rollouts completed; the step of every logged metric
        self._ptx_batches: Iterator[dict[str, torch.Tensor]] | None = None

    @property
    def trained_models(self) -> list[torch.nn.Module]:
        """The policy, and the critic when the estimator has one."""
        return [m for m in (self.policy, self.critic) if m is not None]

    # ------------------------------------------------------------------ setup
    def configure_model(self) -> None:
        """Shard policy, critic, reference and reward model under FSDP (no-op otherwise).

        Only registered submodules: a LoRA policy's reference is the policy itself, and frozen models
        kept on the CPU (``memory.frozen_device: cpu``) stay whole there.
        """
        shard_models(self, {"policy": self.policy, "critic": self.critic, "reference": self._modules.get("ref_policy"),
                            "reward model": self._modules.get("reward_model")})  # fmt: skip

    def configure_optimizers(self):
        """Policy and critic optimizers (one with ``shared_trunk`` or without a critic), schedules
        stepped per rollout."""
        fused = fused_adamw_supported(self)
        if self.critic is None:
            opt, sched = build_optimizer(self.policy.named_parameters(), self.optimizer_cfg, self.max_rollouts, fused)
            return [opt], [sched]
        if self.hparams.critic == "shared_trunk":
            params = itertools.chain(self.policy.named_parameters(), self.critic.named_parameters())
            opt, sched = build_optimizer(params, self.optimizer_cfg, self.max_rollouts, fused)
            return [opt], [sched]
        policy_opt, policy_sched = build_optimizer(
            self.policy.named_parameters(), self.optimizer_cfg, self.max_rollouts, fused
        )  # fmt: skip
        critic_cfg = self.critic_optimizer_cfg or self.optimizer_cfg
        critic_opt, critic_sched = build_optimizer(self.critic.named_parameters(), critic_cfg, self.max_rollouts, fused)
        return [policy_opt, critic_opt], [policy_sched, critic_sched]

    def _optimizer_list(self) -> list:
        optimizers = self.optimizers()
        return optimizers if isinstance(optimizers, list) else [optimizers]

    def on_fit_start(self) -> None:
        """Refuse, before any work is done: PPO-ptx without a second data source, an export target
        the end of fit could not write, a prompt batch the minibatches cannot divide."""
        check_export_at_fit_start(self.trainer, self.export_dir, self.export_existing)
        warn_if_slow_precision(self.trainer)
        batch_size = getattr(self.trainer.datamodule, "batch_size", None)
        if isinstance(batch_size, int):
            self._check_rollout_rows(batch_size * self.sampling.samples_per_prompt)
        if self.ppo.ptx_coef > 0 and not hasattr(self.trainer.datamodule, "ptx_dataloader"):
            raise ValueError("ppo.ptx_coef > 0 needs a data module with ptx_dataloader() (SFT-style batches)")

    def _stream_seed(self, stream: int) -> int:
        """A seed for (seed, rank, rollout, stream): stateless, so a resumed run draws the same numbers."""
        rank_seed = self.rollout_seed + self.global_rank * 100003  # N details #14
        return (rank_seed * 1_000_003 + self.rollout_index * 16 + stream) % (2**63)

    # ------------------------------------------------------------------ rollout
    def generate(self, batch: dict[str, torch.Tensor]) -> Generated:
        """Sample responses to the prompts of ``batch`` with the unwrapped policy.

        Under FSDP the ranks step together until every rank's responses have ended (each forward
        pass is a collective; ``synced_gpus``), with the policy's weights gathered once for the call.
        """
        generator = torch.Generator().manual_seed(self._stream_seed(STREAM_SAMPLE))
        synced = is_sharded(self.policy) and torch.distributed.is_initialized()
        with gathered_for_generation(self.policy):
            return generate_responses(
                self.policy, batch["input_ids"], batch["attention_mask"], self.sampling,
                eos_token_id=self.stop_ids, pad_token_id=self.tokenizer.pad_token_id, generator=generator,
                synced_gpus=synced, return_logits=self._old_logprobs_from_sampling,
            )  # fmt: skip

    @property
    def _old_logprobs_from_sampling(self) -> bool:
        """``ppo.old_logprobs: sampling``, unless the policy forward runs anyway (a shared-trunk critic)."""
        shared = self.critic is not None and self.critic.needs_policy_hidden
        return self.ppo.old_logprobs == "sampling" and not shared

    def score(self, query_responses: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The reward model's score ``(B,)`` at the last attended token (the last response token).

        Adds the normalisation bias an exported RM could not fold into its weights (stored in its
        config; 0 when folded), so the score is the normalised reward for every architecture.
        """
        raw = call_on_own_device(sequence_scores, self.reward_model, query_responses, attention_mask)  # (B,)
        return raw + reward_offset(self.reward_model.config)  # (B,)

    def policy_and_values(
        self, query_responses: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Response logits ``(B, R, V)`` and values ``(B, R)`` (None without a critic); value t is
        read where token t is predicted."""
        needs_hidden = self.critic is not None and self.critic.needs_policy_hidden
        logits, out = forward_response_logits(
            self.policy, query_responses, attention_mask, prompt_length, output_hidden_states=needs_hidden
        )  # (B, R, V)
        if self.critic is None:
            return logits, None
        hidden = out.hidden_states[-1] if needs_hidden else None  # (B, T, D)
        values = self.critic(query_responses, attention_mask, hidden)  # (B, T)
        return logits, values[:, prompt_length - 1 : -1]  # (B, R, V), (B, R)

    @torch.no_grad()
    def _score_chunk(self, gen: Generated, prompt_length: int) -> dict[str, torch.Tensor]:
        """Old logprobs, reference logprobs, values, entropy and ``raw_scores``, the RM's scores (when the RM
        is a source; the reward functions are called once per rollout in :meth:`make_rollout`), of a few rows."""
        temperature = self.sampling.temperature
        ids, mask = gen.query_responses, gen.attention_mask
        if gen.logits is not None:  # ppo.old_logprobs "sampling": the logits generate sampled from
            logits = gen.logits  # (B, R, V)
            values = None if self.critic is None else self.critic(ids, mask, None)[:, prompt_length - 1 : -1]  # (B, R)
        else:
            logits, values = self.policy_and_values(ids, mask, prompt_length)  # (B, R, V), (B, R) or None
        old_logprobs = token_logprobs(logits, gen.response_ids, temperature)  # (B, R)
        return {
            "old_logprobs": old_logprobs,
            "ref_logprobs": self.reference.logprobs(gen, temperature),  # (B, R)
            # Without a critic the rollout carries zeros in its place (never read by a loss).
            "old_values": torch.zeros_like(old_logprobs) if values is None else values.float(),  # (B, R)
            "entropy": entropy_from_logits(logits, temperature),  # (B, R)
            **({"raw_scores": self.score(*self._reward_model_inputs(gen)).float()}  # (B,)
               if self.reward_cfg.uses_reward_model else {}),
        }

    def _reward_model_inputs(self, gen: Generated) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows the reward model reads: as sampled, or with EOS after unfinished responses
        (``reward.unfinished``, :data:`~rlhf_lit.models.scoring.UnfinishedScoring`)."""
        return reward_model_rows(
            gen.query_responses, gen.attention_mask, gen.ended, self.reward_cfg.unfinished, self.stop_ids[0],
            self.tokenizer.pad_token_id,
        )  # (B, T) or (B, T + 1), x2

    def score_rollout(self, gen: Generated) -> dict[str, torch.Tensor]:
        """:meth:`_score_chunk` over the batch in chunks of ``ppo.score_chunk_size`` rows."""
        prompt_length = gen.query_responses.shape[1] - gen.response_ids.shape[1]
        size = self.ppo.score_chunk_size or gen.response_ids.shape[0]
        parts = [
            self._score_chunk(gen.rows(i, i + size), prompt_length)
            for i in range(0, gen.response_ids.shape[0], size)
        ]  # fmt: skip
        return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}

    def make_rollout(
        self, batch: dict[str, torch.Tensor], timer: RolloutTimer
    ) -> tuple[Rollout, dict[str, torch.Tensor]]:
        """Generate, score, shape rewards and compute advantages; returns the rollout and its
        rollout-time statistics (``objective/entropy``, ``reward/<source>``: means over the rows)."""
        whitens = self.ppo.whiten_advantages or self.reward_cfg.whiten != "none"
        if whitens and batch["input_ids"].shape[0] < 2:
            # A batch statistic of one row is NaN (score whitening) or can fail on this rank only
            # (a one-token response), which would leave the other ranks waiting in a collective.
            raise ValueError("whitening (ppo.whiten_advantages or reward.whiten) needs >= 2 prompts per rank")
        batch = repeat_prompts(batch, self.sampling.samples_per_prompt)  # k consecutive rows per prompt
        gen = self.generate(batch)
        timer.mark("generate")
        scored = self.score_rollout(gen)
        for frozen in (self._modules.get("ref_policy"), self._modules.get("reward_model")):
            if frozen is not None:  # under FSDP: free the root weights a no-grad pass leaves gathered
                reshard(frozen)
        mask = gen.response_mask  # (B, R)
        texts = reward_batch(self.tokenizer, batch, gen) if self.reward_sources.needs_texts else None
        raw_scores, reward_parts = self.reward_sources(scored.get("raw_scores"), texts)  # (B,), {name: (B,)}
        scores = self.reward_cfg.shape(raw_scores, gen.ended)  # (B,): one placement path for every source
        # kl.mode "loss": the KL is measured (metrics, controller) but paid in the loss, not here.
        reward_kl_coef = self.kl_ctl.value if self.kl_cfg.mode == "reward" else 0.0
        rewards, kl = kl_penalized_rewards(
            scores, scored["old_logprobs"], scored["ref_logprobs"], mask, reward_kl_coef, self.kl_cfg.estimator
        )  # (B, R), (B, R)
        if self.reward_cfg.whiten == "rewards":
            rewards = masked_whiten(rewards, mask, keep_mean=True)  # (B, R)
        values = scored["old_values"] if self.critic is not None else None
        advantages, returns = self.estimator(rewards, values, mask)  # (B, R) x2
        timer.mark("score")
        rollout = Rollout(
            query_responses=gen.query_responses, attention_mask=gen.attention_mask,
            response_ids=gen.response_ids, response_mask=mask, ended=gen.ended,
            old_logprobs=scored["old_logprobs"], ref_logprobs=scored["ref_logprobs"],
            old_values=scored["old_values"], raw_scores=raw_scores, scores=scores, kl=kl,
            rewards=rewards, advantages=advantages, returns=returns,
        )  # fmt: skip
        stats = {"objective/entropy": masked_mean(scored["entropy"], mask), **{k: v.mean() for k, v in reward_parts.items()}}
        return rollout, stats

    # ------------------------------------------------------------------ update
    def _next_ptx_batch(self) -> dict[str, torch.Tensor]:
        """The next SFT-style batch of the second data source, cycling through it."""
        if self._ptx_batches is None:
            self._ptx_batches = self._cycle(self.trainer.datamodule.ptx_dataloader())
        # non_blocking: the host does not wait for the copy (no stall once per minibatch).
        return {k: v.to(self.device, non_blocking=True) for k, v in next(self._ptx_batches).items()}

    @staticmethod
    def _cycle(loader) -> Iterator[dict[str, torch.Tensor]]:
        """Endless passes over a re-iterable loader (not itertools.cycle, which keeps every batch)."""
        while True:
            empty = True
            for batch in loader:
                empty = False
                yield batch
            if empty:
                raise RuntimeError("ptx_dataloader() gave no batch (or is a one-shot iterator)")

    def minibatch_loss(self, mb: Rollout) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Clipped policy loss + vf_coef * clipped value loss (- entropy bonus) (+ beta * KL with
        ``kl.mode: loss``) (+ ptx_coef * SFT loss)."""
        cfg, mask = self.ppo, mb.response_mask
        logits, values = self.policy_and_values(mb.query_responses, mb.attention_mask, mb.prompt_length)
        logprobs = token_logprobs(logits, mb.response_ids, self.sampling.temperature)  # (B, R)
        policy_loss, policy_stats = ppo_policy_loss(logprobs, mb.old_logprobs, mb.advantages, mask, cfg.clip_range)
        value_loss, value_stats = torch.zeros((), device=self.device), {"clipfrac": torch.zeros((), device=self.device)}
        if values is not None:
            value_loss, value_stats = clipped_value_loss(values, mb.old_values, mb.returns, mask, cfg.value_clip_range)
        # Keep the entropy graph only when it is trained on (a (B, R, V) graph is not free).
        entropy_logits = logits if cfg.entropy_coef > 0 else logits.detach()
        entropy = masked_mean(entropy_from_logits(entropy_logits, self.sampling.temperature), mask)  # ()
        loss = policy_loss + cfg.vf_coef * value_loss - cfg.entropy_coef * entropy  # ()
        kl_term = None
        if self.kl_cfg.mode == "loss":  # beta is the rollout's: the controller updates after the update
            kl_term = kl_loss(logprobs, mb.ref_logprobs, mask, self.kl_cfg.estimator)  # ()
            loss = loss + self.kl_ctl.value * kl_term  # ()
        loss = loss * self._rank_token_weight(mask)  # (): a token mean over the minibatches of all ranks
        ptx = torch.zeros((), device=self.device)  # ()
        if cfg.ptx_coef > 0:
            batch = self._next_ptx_batch()
            ptx_logits = forward_with_positions(self.policy, batch["input_ids"], batch["attention_mask"]).logits
            ptx = sft_loss(ptx_logits, batch["labels"])  # ()
            loss = loss + cfg.ptx_coef * ptx  # ()
        stats = {
            "loss/policy": policy_loss.detach(), "loss/value": value_loss.detach(), "loss/ptx": ptx.detach(),
            "policy/entropy": entropy.detach(), "policy/clipfrac": policy_stats["clipfrac"],
            "policy/approxkl": policy_stats["approx_kl"], "policy/ratio": policy_stats["ratio_mean"],
            "value/clipfrac": value_stats["clipfrac"],
        }  # fmt: skip
        if kl_term is not None:
            stats["loss/kl"] = kl_term.detach()
        return loss, stats

    def _rank_token_weight(self, mask: torch.Tensor) -> torch.Tensor:
        """``n_rank * world_size / n_all``: turns this rank's token mean into its share of the token
        mean over the same minibatch of every rank, once DDP / FSDP average the gradients.

        Ranks hold different numbers of response tokens (responses end at different lengths);
        averaging per-rank means would weight a token of a short-response rank more. One small
        all-reduce per minibatch, no host sync; exactly 1 on a single process.
        """
        world = self.trainer.world_size if self._trainer is not None else 1
        count = mask.sum().float()  # ()
        if world == 1:
            return torch.ones((), device=mask.device)
        return count * world / self.trainer.strategy.reduce(count.clone(), reduce_op="sum")  # () (reduce is in place)

    def _check_rollout_rows(self, rows: int) -> None:
        """The rows per rollout (per process) must split into whole optimizer steps."""
        if rows % self.ppo.rows_per_step != 0:
            k = self.sampling.samples_per_prompt
            size = (f"{rows} prompts per process: the data module's batch_size" if k == 1 else
                    f"{rows} rows per process: the data module's batch_size {rows // k} prompts x "
                    f"sampling.samples_per_prompt {k}")  # fmt: skip
            raise ValueError(
                f"the rollout batch ({size}) must be a multiple "
                f"of ppo.minibatch_size * ppo.grad_accum = {self.ppo.minibatch_size} * {self.ppo.grad_accum}"
            )

    def train_on_rollout(self, rollout: Rollout) -> dict[str, torch.Tensor]:
        """K epochs of shuffled minibatches; an optimizer step every ``grad_accum`` minibatches."""
        cfg = self.ppo
        optimizers = self._optimizer_list()
        generator = torch.Generator().manual_seed(self._stream_seed(STREAM_SHUFFLE))
        history: list[dict[str, torch.Tensor]] = []
        for _ in range(cfg.epochs):
            for i, mb in enumerate(minibatches(rollout, cfg.minibatch_size, generator)):
                loss, stats = self.minibatch_loss(mb)
                self.manual_backward(loss / cfg.grad_accum)  # once, on the sum: DDP sees every parameter
                history.append(stats)
                if (i + 1) % cfg.grad_accum == 0:
                    with one_scaler_update(self.trainer):  # fp16: both optimizers see one loss scale
                        for opt in optimizers:
                            opt.step()  # clips in on_before_optimizer_step
                    for opt in optimizers:
                        opt.zero_grad(set_to_none=True)
        return {k: torch.stack([h[k] for h in history]).mean() for k in history[0]}

    def on_before_optimizer_step(self, optimizer) -> None:
        """Skip a step with non-finite gradients; clip the gradient norm to ``ppo.max_grad_norm``.

        Here, not before ``opt.step()``: Lightning calls this hook after it unscales fp16
        (``16-mixed``) gradients, so the clip sees true gradients, not ones times the loss scale.
        """
        kind = ("the policy", "the critic")[self.trainer.optimizers.index(optimizer)]
        if self.hparams.critic == "shared_trunk":
            kind = "the policy and value head"
        where = f"rollout {self.rollout_index}, optimizer step {self.global_step}"
        if not self.nonfinite.check_optimizer(optimizer, kind, has_gradient_scaler(self.trainer), where):
            return  # gradients dropped: this optimizer's step changes nothing
        if self.ppo.max_grad_norm is not None:
            self.clip_gradients(optimizer, gradient_clip_val=self.ppo.max_grad_norm, gradient_clip_algorithm="norm")

    # ------------------------------------------------------------------ the step
    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        """One rollout and its PPO update; stops the trainer after ``max_rollouts``."""
        if self.rollout_index >= self.max_rollouts:
            self.trainer.should_stop = True
            return
        self._check_rollout_rows(batch["input_ids"].shape[0] * self.sampling.samples_per_prompt)  # before any work
        timer = RolloutTimer(self.device)
        rollout, rollout_stats = self.make_rollout(batch, timer)
        bad = nonfinite_rollout_parts(rollout, lambda t: self.trainer.strategy.reduce(t, reduce_op="sum"))
        if bad:  # no update on NaN: it would turn every weight into NaN
            self.nonfinite.skipped("rollout", f"rollout {self.rollout_index}: non-finite {', '.join(bad)}")
            self._end_rollout(rollout.batch_size, {"skipped/nonfinite_rollout": 1.0})
            return
        with train_mode(*self.trained_models):  # what activates gradient checkpointing (dropout is off)
            train_stats = self.train_on_rollout(rollout)
        timer.mark("train")
        kl_coef = self.kl_ctl.value
        metrics = self.rollout_metrics(rollout, rollout_stats, train_stats, kl_coef, timer)
        # The KL controller sees the KL averaged over all ranks and the global batch size.
        self.kl_ctl.update(metrics["objective/kl"], n_steps=rollout.batch_size * self.trainer.world_size)
        self.log_dict({"score": metrics["objective/scores"], "kl": metrics["objective/kl"]}, prog_bar=True, logger=False)
        self._end_rollout(rollout.batch_size, {**metrics, "skipped/nonfinite_rollout": 0.0})

    def _end_rollout(self, rows: int, metrics: dict[str, float]) -> None:
        """Log the rollout, count it, advance the data position and the schedules, stop at the end."""
        for logger in self.loggers:  # step = rollout index, not global_step (which counts opt steps)
            logger.log_metrics(metrics, step=self.rollout_index)
        self.rollout_index += 1
        datamodule = getattr(self.trainer, "datamodule", None)
        if hasattr(datamodule, "mark_consumed"):
            # The prompts of every rank (k rows each): the data position is global (see the class docstring).
            datamodule.mark_consumed(rows // self.sampling.samples_per_prompt * self.trainer.world_size)
        schedulers = self.lr_schedulers()
        for scheduler in schedulers if isinstance(schedulers, list) else [schedulers]:
            scheduler.step()
        if self.rollout_index >= self.max_rollouts:
            self.trainer.should_stop = True

    # ------------------------------------------------------------------ metrics and export
    def rollout_metrics(
        self, rollout: Rollout, rollout_stats: dict[str, torch.Tensor], train_stats: dict[str, torch.Tensor],
        kl_coef: float, timer: RolloutTimer,
    ) -> dict[str, float]:
        """Everything logged for a rollout, averaged over ranks (see :mod:`rlhf_lit.stages.ppo_metrics`).

        The responses are decoded once, here, after the update: distinct-n always, the judge when
        set. ``kl_coef`` is the coefficient the rollout's rewards were shaped with.
        """
        entropy = rollout_stats["objective/entropy"]
        local = rollout_statistics(rollout, entropy, train_stats, kl_coef, self.critic is not None)  # no sync
        local.update({k: v for k, v in rollout_stats.items() if k.startswith("reward/")})  # each source
        texts = response_texts(
            self.tokenizer, rollout.query_responses, rollout.attention_mask, rollout.response_mask, rollout.ended
        )
        local.update(text_statistics(texts, self.judge))
        timer.mark("text")
        reduced = reduce_over_ranks(self.trainer.strategy, local, self.device)
        learning_rates = [opt.param_groups[0]["lr"] for opt in self._optimizer_list()]
        return logged_metrics(reduced, timer, learning_rates, kl_coef, rollout.batch_size * self.trainer.world_size)

    def on_fit_end(self) -> None:
        """Export the trained policy and its tokenizer in Hugging Face format (rank 0)."""
        self.exported_path = export_at_fit_end(
            self.trainer, exportable(self.policy), self.tokenizer, self.export_dir, "PPO policy", self.export_existing
        )

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Drop the frozen models; add the rollout counter, KL controller and global RNG state.

        Refuses (:class:`~rlhf_lit.stages.nonfinite.NonFiniteError`) to save non-finite weights.
        """
        assert_finite(self.policy, "the policy")
        if self.critic is not None:
            assert_finite(self.critic, "the critic")
        state = checkpoint["state_dict"]  # {} on ranks > 0 under FSDP (gathered on rank 0)
        checkpoint["state_dict"] = {k: v for k, v in state.items() if not k.startswith(self.FROZEN_PREFIXES)}
        checkpoint["ppo"] = {
            "rollout_index": self.rollout_index,
            "kl_controller": self.kl_ctl.state_dict(),
            # Sampling and shuffling use folded seeds, not this; kept for user code that draws from it.
            "torch_rng_state": torch.get_rng_state(),
            "nonfinite": self.nonfinite.state_dict(),
            "world_size": self.trainer.world_size,
            "sources": self._source_fingerprints(),
        }

    def _source_fingerprints(self) -> dict[str, str]:
        """The models the run reads by path, as they are on disk now (see :func:`source_fingerprint`)."""
        paths = {"sft_model": self.hparams.sft_model, "reward_model": self.hparams.reward_model,
                 "value_model": self.hparams.value_model}  # fmt: skip
        return {what: source_fingerprint(path) for what, path in paths.items() if path is not None}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Check the configuration against the checkpoint's (:mod:`rlhf_lit.stages.resume`) and
        restore the PPO state. The frozen models are not in checkpoints (:meth:`load_state_dict`)."""
        ppo_state = checkpoint["ppo"]
        extra = {}
        if self._trainer is not None:
            extra["trainer.world_size"] = (ppo_state.get("world_size", self.trainer.world_size), self.trainer.world_size)
        now = self._source_fingerprints()
        for what, saved in ppo_state.get("sources", {}).items():  # a model directory replaced in place
            extra[f"model.{what} (its files)"] = (saved, now.get(what))
        safe = SAFE_ON_RESUME
        schedules = (self.optimizer_cfg, self.critic_optimizer_cfg or self.optimizer_cfg)
        if any(cfg.schedule != "constant" for cfg in schedules):
            safe = tuple(k for k in safe if k != "max_rollouts")  # it is the decaying schedule's length
        check_module_resume(self, checkpoint, safe, extra)
        self.rollout_index = int(ppo_state["rollout_index"])
        if "nonfinite" in ppo_state:
            self.nonfinite.load_state_dict(ppo_state["nonfinite"])
        self.kl_ctl.load_state_dict(ppo_state["kl_controller"])
        torch.set_rng_state(ppo_state["torch_rng_state"])

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Load weights; the frozen models (:attr:`FROZEN_PREFIXES`) may be missing: they were reloaded
        from their paths. Any other missing or unknown weight is refused when ``strict``."""
        result = super().load_state_dict(state_dict, strict=False, assign=assign)
        check_loaded_keys(result.missing_keys, result.unexpected_keys, self.FROZEN_PREFIXES, strict)
        return result

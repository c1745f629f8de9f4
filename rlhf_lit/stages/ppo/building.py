"""What :class:`~rlhf_lit.stages.ppo.module.PPOModule` builds from its settings: the tokenizer and the
four models (:func:`build_models`, sharded by :func:`shard_stage_models`), the KL controller
(:func:`kl_controller`) and the optimizers (:func:`build_optimizers`).

The models are loaded in one fixed order (tokenizer, policy, reference, reward model, critic): a
fresh score head draws from the global RNG, so the order is part of what a seed reproduces.

:func:`build_models` and :func:`shard_stage_models` take the stage object, typed by its base class
(:class:`~rlhf_lit.stages.base.StageModule`): ``module.py`` imports this file, never the reverse, and
each function names the settings it reads of the stage.
"""

from __future__ import annotations

import itertools

import torch

from rlhf_lit.functional import AdaptiveKLController, FixedKLController, KLController
from rlhf_lit.models import load_causal_lm, load_reward_model
from rlhf_lit.models.freezing import freeze_lower_layers, freeze_modules, transformer_blocks
from rlhf_lit.models.generation import stop_token_ids
from rlhf_lit.models.loading import ModelLoading
from rlhf_lit.models.lora import with_lora
from rlhf_lit.models.memory import attach_frozen, enable_gradient_checkpointing
from rlhf_lit.models.reference import build_reference
from rlhf_lit.models.reward_ensemble import RewardEnsemble, is_reward_ensemble, load_reward_ensemble, member_paths
from rlhf_lit.models.sharding import shard_models
from rlhf_lit.models.trunk_cache import TrunkCaches
from rlhf_lit.models.value import SeparateCritic, build_critic
from rlhf_lit.sources import check_local_source
from rlhf_lit.stages.base import StageModule, stage_tokenizer
from rlhf_lit.stages.optim import build_optimizer, fused_adamw_supported
from rlhf_lit.stages.ppo.checks import check_sharded_compile
from rlhf_lit.stages.ppo.config import KLConfig
from rlhf_lit.tokenizer import check_same_vocabulary


def build_models(stage: StageModule) -> None:
    """Set ``stage``'s tokenizer, policy, ``stop_ids`` (and ``response_end_id``), reference, reward model and critic, as its
    settings ask (``lora_cfg``, ``critic_lora_cfg``, ``memory``, ``reward_cfg``, ``estimator``, and of its
    hyperparameters the models' paths, ``tokenizer_path``, ``missing_pad``, ``critic``, the loading options
    of :func:`stage_loading` and ``trainable_layers``). Every model is loaded through that one
    :class:`~rlhf_lit.models.loading.ModelLoading`.

    The frozen reference copy and the reward model are attached with
    :func:`~rlhf_lit.models.memory.attach_frozen` (submodules, unless kept on the CPU).
    """
    settings = stage.hparams
    sft_model, reward_model, value_model = settings.sft_model, settings.reward_model, settings.value_model
    tokenizer_path, critic = settings.tokenizer_path, settings.critic
    for what, path in (("sft_model", sft_model), ("reward_model", reward_model), ("value_model", value_model)):
        check_local_source(path, what)  # a damaged file of any of them: named before the first is loaded
    loading = stage_loading(stage)
    stage.tokenizer = tokenizer = stage_tokenizer(
        tokenizer_path,
        sft_model,
        "left",
        settings.missing_pad,
        loading.revision,
        loading.trust_remote_code,
        model_arg="sft_model",
        tokenizer_arg="tokenizer_path",
    )
    stage.policy = policy = with_lora(load_causal_lm(sft_model, tokenizer, loading), stage.lora_cfg, "causal_lm")
    # Every id that ends a response (the model may list several): sampling, masks, the reward
    # position and the missing-EOS penalty all follow from this one set.
    stage.stop_ids = stop_token_ids(policy, tokenizer)
    # What the reward model reads after a cut response (reward.unfinished: with_eos): the EOS, or, for chat
    # prompts, the template's end of turn (check_data_module sets it, from the data module).
    stage.response_end_id = stage.stop_ids[0]
    base_vocab = policy.config.vocab_size
    for what, path in (("reward_model", reward_model), ("value_model", value_model)):
        if path is not None:  # before loading: a mismatched RM would be resized to fit silently
            check_same_vocabulary(tokenizer, path, what, base_vocab)
    frozen_device = stage.memory.frozen_device
    frozen = loading.but(dtype=stage.memory.frozen_dtype or loading.dtype)  # the reference and the reward model
    # The reward and value models are other repositories: sft_model's revision names none of their commits.
    other, frozen_other = loading.but(revision=None), frozen.but(revision=None)

    def frozen_sft_copy() -> torch.nn.Module:  # only without LoRA: see build_reference
        reference = load_causal_lm(sft_model, tokenizer, frozen).requires_grad_(False).eval()
        attach_frozen(stage, "ref_policy", reference, frozen_device)
        return stage.ref_policy

    stage.reference = build_reference(policy, frozen_sft_copy)
    ensemble = is_reward_ensemble(reward_model)
    if stage.reward_cfg.uses_reward_model:
        load = load_reward_ensemble if ensemble else load_reward_model
        rm = load(reward_model, tokenizer, frozen_other).requires_grad_(False).eval()  # frozen
        attach_frozen(stage, "reward_model", rm, frozen_device)
    uses_critic = stage.estimator.uses_critic
    if uses_critic and critic == "separate" and (value_model or reward_model) is None:
        raise ValueError("a separate critic starts from value_model or reward_model; set one of them")
    # A critic from an ensemble starts from its member 0 (a whole reward model, normalised like the others).
    critic_start = value_model or (member_paths(reward_model)[0] if ensemble else reward_model)
    stage.critic = (
        build_critic(critic, policy, critic_start, tokenizer, other, stage.critic_lora_cfg) if uses_critic else None
    )
    for model in (policy, stage.critic if critic == "separate" else None):
        if model is not None:
            freeze_lower_layers(model, settings.trainable_layers)
    freeze_modules(policy, settings.frozen_modules)  # the policy's only: the critic's top MLP serves its values
    stage.trunk_caches = trunk_caches(stage) if settings.cache_frozen else None
    if stage.memory.gradient_checkpointing:
        enable_gradient_checkpointing(*stage.trained_models)


def trunk_caches(stage: StageModule) -> TrunkCaches:
    """``cache_frozen``: one :class:`~rlhf_lit.models.trunk_cache.TrunkCaches` over the policy, a separate
    critic, the reference copy and a single reward model, each keeping all but its top
    ``trainable_layers`` blocks (a model whose frozen weights match another's shares its store)."""
    caches = TrunkCaches(fill="batch")  # emptied every rollout: a resume starts at a rollout, with none kept
    frozen = (getattr(stage, name, None) for name in ("ref_policy", "reward_model"))
    critic = stage.critic.model if isinstance(stage.critic, SeparateCritic) else None  # its HF model: the hooks' caller
    for model in (stage.policy, critic, *frozen):
        if model is None or isinstance(model, RewardEnsemble):  # an ensemble's members keep their own trunks: not here
            continue
        caches.attach(model, len(transformer_blocks(model)) - stage.hparams.trainable_layers)
    return caches


def stage_loading(stage: StageModule) -> ModelLoading:
    """How every model of ``stage`` is loaded: its ``dtype``, ``revision``, ``trust_remote_code`` and
    ``attn_implementation`` (of its hyperparameters) as one :class:`~rlhf_lit.models.loading.ModelLoading`."""
    settings = stage.hparams
    return ModelLoading(settings.dtype, settings.revision, settings.trust_remote_code, settings.attn_implementation)


def kl_controller(kl: KLConfig) -> KLController:
    """The adaptive (``kl.kind: adaptive``) or fixed KL controller, starting at ``kl.init_coef``."""
    if kl.kind == "adaptive":
        return AdaptiveKLController(kl.init_coef, kl.target, kl.horizon)
    return FixedKLController(kl.init_coef)


def build_optimizers(stage: StageModule) -> tuple[list, list]:
    """Policy and critic optimizers and their schedules (stepped per rollout, ``max_rollouts`` long):
    one for the policy without a critic, one for policy and value head with ``critic: shared_trunk``,
    else two (the critic's with ``critic_optimizer_cfg``, None = ``optimizer_cfg``)."""
    policy, critic, optimizer = stage.policy, stage.critic, stage.optimizer_cfg
    if critic is None:
        groups = [(policy.named_parameters(), optimizer)]
    elif stage.hparams.critic == "shared_trunk":
        groups = [(itertools.chain(policy.named_parameters(), critic.named_parameters()), optimizer)]
    else:
        critic_optimizer = stage.critic_optimizer_cfg or optimizer
        groups = [(policy.named_parameters(), optimizer), (critic.named_parameters(), critic_optimizer)]
    fused = fused_adamw_supported(stage)
    built = [build_optimizer(params, config, stage.max_rollouts, fused) for params, config in groups]
    return [opt for opt, _ in built], [sched for _, sched in built]


def shard_stage_models(stage: StageModule, sharded: bool) -> None:
    """Shard ``stage``'s policy, critic, reference and reward model when the strategy gives a device
    mesh (``sharded``; ``configure_model``).

    Only registered submodules: a LoRA policy's reference is the policy itself, and frozen models
    kept on the CPU (``memory.frozen_device: cpu``) stay whole there. A reward-model ensemble is
    refused under FSDP (one clear line, before any rollout), and so is ``sampling.decode: compiled``
    (:func:`~rlhf_lit.stages.ppo.checks.check_sharded_compile`), and ``ppo.forward: compiled``.
    """
    check_sharded_compile(stage.sampling.decode, stage.ppo.forward, sharded)
    if sharded and isinstance(getattr(stage, "reward_model", None), RewardEnsemble):
        raise ValueError(
            "a reward-model ensemble (model.reward_model with ensemble.json) is not supported under "
            "fsdp / fsdp2; use one device or --trainer.strategy ddp"
        )
    shard_models(stage, {"policy": stage.policy, "critic": stage.critic, **stage.frozen_submodules()})

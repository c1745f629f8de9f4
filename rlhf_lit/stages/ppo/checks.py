"""The PPO settings that cannot work together, refused before any model is loaded.

Each config dataclass checks its own values (:mod:`rlhf_lit.stages.ppo.config`); what spans
several groups or constructor arguments is checked here, in one place, with one message each.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from rlhf_lit.models.compiled_passes import ForwardPasses
from rlhf_lit.models.freezing import check_frozen_modules, check_trainable_layers
from rlhf_lit.models.generation import Decode
from rlhf_lit.models.positions import check_sequence_length
from rlhf_lit.models.reward_ensemble import is_reward_ensemble, member_paths
from rlhf_lit.option_values import check_least
from rlhf_lit.stages.base import StageModule, TrainerPlan
from rlhf_lit.stages.ppo.config import PPOConfig, RewardConfig
from rlhf_lit.tokenizer import check_same_chat_template


def check_settings(stage: StageModule) -> None:
    """The stage's settings that contradict each other, checked once its config groups, estimator and
    hyperparameters are kept and before any model is loaded: the reward against sampling and the reward
    model given; LoRA, critic and run length; ``ppo.forward: compiled`` with what its graph cannot hold;
    critic settings changed under a critic-free estimator (``ppo.estimator`` other than ``gae``)."""
    settings, reward, lora, critic_lora = stage.hparams, stage.reward_cfg, stage.lora_cfg, stage.critic_lora_cfg
    reward_model, shared_trunk = settings.reward_model, settings.critic == "shared_trunk"
    if stage.sampling.ignore_eos and reward.missing_eos_penalty is not None:
        raise ValueError(
            "sampling.ignore_eos: no response ends at EOS, so reward.missing_eos_penalty would hit "
            "every one; leave it null"
        )
    if reward.uses_reward_model and reward_model is None:
        raise ValueError("reward.sources uses the reward model (a source with function: null); set model.reward_model")
    for source in reward.sources:
        if source.function is None and source.aggregate != "mean" and not is_reward_ensemble(reward_model):
            raise ValueError(
                f"reward source {source.name!r}: aggregate {source.aggregate} needs a reward-model ensemble; "
                f"model.reward_model {reward_model} is a single reward model (no ensemble.json)"
            )
    for what, cfg in (("lora", lora), ("critic_lora", critic_lora)):
        if cfg is not None and cfg.dropout != 0.0:
            raise ValueError(f"{what}.dropout must be 0 in PPO: old and new logprobs must agree before an update")
    if shared_trunk and critic_lora is not None:
        raise ValueError("critic_lora applies to a separate critic; with critic='shared_trunk' leave it null")
    if shared_trunk and settings.critic_optimizer is not None:
        raise ValueError(
            "critic='shared_trunk' trains the head with the policy's optimizer; leave critic_optimizer null"
        )
    check_trainable_layers(settings.trainable_layers, lora=lora, critic_lora=critic_lora)
    check_frozen_modules(settings.frozen_modules, lora=lora)
    if settings.cache_frozen and settings.trainable_layers is None:
        raise ValueError("cache_frozen keeps the output of the blocks below trainable_layers; set trainable_layers")
    if settings.cache_frozen and "compiled" in (stage.ppo.forward, stage.sampling.decode):
        raise ValueError(
            "cache_frozen reads its rows in eager passes; set ppo.forward and sampling.decode to eager, or "
            "leave cache_frozen off"
        )
    check_least("max_rollouts", settings.max_rollouts, 1)
    if (
        stage.ppo.forward == "compiled"
        and stage.memory.gradient_checkpointing
        and (lora is not None or critic_lora is not None)
    ):
        # Gradient checkpointing over frozen base weights makes the embeddings' output require grad
        # through a hook (transformers' enable_input_require_grads), which torch.compile refuses.
        raise ValueError(
            "ppo.forward: compiled does not run with memory.gradient_checkpointing and LoRA together; "
            "leave ppo.forward eager, or turn off one of them"
        )
    critic_settings = {
        "critic": settings.critic != "separate",
        "value_model": settings.value_model is not None,
        "critic_lora": critic_lora is not None,
        "critic_optimizer": settings.critic_optimizer is not None,
    }
    if not stage.estimator.uses_critic and any(critic_settings.values()):
        given = ", ".join(k for k, v in critic_settings.items() if v)
        raise ValueError(f"ppo.estimator={stage.ppo.estimator!r} trains no critic; leave {given} at the default")


def check_rollout_rows(rows: int, ppo: PPOConfig, samples_per_prompt: int) -> None:
    """The rows per rollout (per process) must split into whole optimizer steps."""
    if rows % ppo.rows_per_step != 0:
        k = samples_per_prompt
        size = (
            f"{rows} prompts per process: the data module's batch_size"
            if k == 1
            else f"{rows} rows per process: the data module's batch_size {rows // k} prompts x "
            f"sampling.samples_per_prompt {k}"
        )
        raise ValueError(
            f"the rollout batch ({size}) must be a multiple "
            f"of ppo.minibatch_size * ppo.grad_accum = {ppo.minibatch_size} * {ppo.grad_accum}"
        )


def check_whitening_rows(rows: int, world_size: int, ppo: PPOConfig, reward: RewardConfig) -> None:
    """Whitening needs at least two prompts in the batch it is taken over (``ppo.whiten_scope``):
    all processes' (``global``) or each process's (``rank``)."""
    if not (ppo.whiten_advantages or reward.whiten != "none"):
        return
    # A batch statistic of one row is NaN (score whitening) or an error; per rank, the error could
    # come on one rank only (a one-token response) and leave the other ranks waiting in a collective.
    over_all = ppo.whiten_scope == "global"
    if (rows * world_size if over_all else rows) < 2:
        raise ValueError(
            "whitening (ppo.whiten_advantages or reward.whiten) needs >= 2 prompts "
            f"{'over all processes' if over_all else 'per rank'} (ppo.whiten_scope: {ppo.whiten_scope})"
        )


def check_sharded_compile(decode: Decode, forward: ForwardPasses, sharded: bool) -> None:
    """Refuse ``sampling.decode: compiled`` and ``ppo.forward: compiled`` on FSDP2-sharded models
    (``fsdp`` / ``fsdp2``).

    FSDP2 gathers each block's weights in forward hooks that ``torch.compile`` does not trace
    (``torch._dynamo.disable``): the decode step breaks into pieces, which the compiled path's
    ``fullgraph=True`` refuses mid-rollout. One device and ``ddp`` compile it (each process holds
    the whole policy); LoRA adapters compile with it. Checked by the CLI before anything is built
    (:func:`refusal_before_build`, asked by the CLI) and again in ``PPOModule.configure_model``.
    The compiled scoring and training passes read the critic's values through a hook that sharded
    weights need and a compiled graph cannot hold (``models/scoring.py``).
    """
    if sharded and decode == "compiled":
        raise ValueError(
            "sampling.decode compiled is not supported under fsdp / fsdp2: torch.compile cannot trace FSDP2's "
            "weight-gathering hooks into the decode step's one graph; use sampling.decode eager, or "
            "--trainer.strategy ddp (or one device)"
        )
    if sharded and forward == "compiled":
        raise ValueError(
            "ppo.forward compiled is not supported under fsdp / fsdp2; use ppo.forward eager, or "
            "--trainer.strategy ddp (or one device)"
        )


def check_end_of_turn_stops(end_of_turn: int | None, stop_ids: Sequence[int], token: str) -> None:
    """Refuse conversational prompts whose chat template ends the assistant's turn with a token that
    does not stop generation: the policy would write past the end of its turn, and the reward model,
    trained on turns ending with that token, would score sequences unlike its training data.

    Args:
        end_of_turn: the template's end-of-turn id (the data module's ``end_of_turn_id()``,
            :meth:`~rlhf_lit.data.prompts.PromptDataModule.end_of_turn_id`);
            None: the template ends turns with no special token, nothing to check.
        stop_ids: the ids that end a response in sampling (:func:`~rlhf_lit.models.generation.stop_token_ids`).
        token: the end-of-turn token's text, for the message.
    """
    if end_of_turn is None or end_of_turn in stop_ids:
        return
    raise ValueError(
        f"the chat template ends the assistant's turn with {token!r} (id {end_of_turn}), which does not stop "
        f"generation (stop ids {list(stop_ids)}): the policy would write past its turn. Make it the tokenizer's "
        "eos_token or list it in the model's generation_config.json eos_token_id"
    )


def check_data_module(stage: StageModule) -> None:
    """Refuse, before any work is done: PPO-ptx without a second data source, a prompt batch the
    minibatches cannot divide, and for prompts rendered with the chat template (``chat_rendered``) a
    template end of turn that does not stop generation (:func:`check_end_of_turn_stops`) or a reward
    model trained on another rendering (it reads the rendered conversation's ids as they are). For those
    prompts it sets ``stage.response_end_id`` to the template's end of turn: the token a cut response gets
    before the reward model reads it (``reward.unfinished: with_eos``), as the reward model's chat data
    ended every response (a template may end turns with a token of its own, not the EOS).

    The data module (``stage.trainer.datamodule``) is duck-typed (stages never import data): ``batch_size``,
    ``ptx_dataloader``, ``chat_rendered`` and ``end_of_turn_id()`` are looked for, not required. Of the stage it
    reads ``sampling``, ``ppo``, ``reward_cfg``, ``tokenizer``, ``stop_ids`` and the ``reward_model`` setting.
    """
    datamodule, sampling, ppo, tokenizer = stage.trainer.datamodule, stage.sampling, stage.ppo, stage.tokenizer
    batch_size = getattr(datamodule, "batch_size", None)
    if isinstance(batch_size, int):
        check_rollout_rows(batch_size * sampling.samples_per_prompt, ppo, sampling.samples_per_prompt)
    if ppo.ptx_coef > 0 and not hasattr(datamodule, "ptx_dataloader"):
        raise ValueError("ppo.ptx_coef > 0 needs a data module with ptx_dataloader() (SFT-style batches)")
    check_rollout_lengths(stage)
    if not getattr(datamodule, "chat_rendered", False):
        return
    end = datamodule.end_of_turn_id()  # PromptDataModule.end_of_turn_id: no data import
    check_end_of_turn_stops(end, stage.stop_ids, tokenizer.convert_ids_to_tokens(end) if end is not None else "")
    if end is not None:  # a chat reward model was trained on responses ending with it, not with the EOS
        stage.response_end_id = end
    reward_model = stage.hparams.reward_model
    if stage.reward_cfg.uses_reward_model and reward_model:
        model = member_paths(reward_model)[0] if is_reward_ensemble(reward_model) else reward_model
        check_same_chat_template(tokenizer, model, "reward_model")


def check_rollout_lengths(stage: StageModule) -> None:
    """Refuse a rollout row longer than a model's learned position table (a prompt of ``max_prompt_length``
    tokens and ``max_new_tokens`` sampled; the reward model's row one longer when a cut response gets an end,
    ``reward.unfinished: with_eos``), and a ptx row longer than the policy's
    (:func:`~rlhf_lit.models.positions.check_sequence_length`)."""
    datamodule = stage.trainer.datamodule
    prompt = getattr(datamodule, "max_prompt_length", None)
    if not isinstance(prompt, int):
        return
    new = stage.sampling.max_new_tokens
    where = f"--data.init_args.max_prompt_length {prompt} + --model.init_args.sampling.max_new_tokens {new}"
    policy_side = [stage.policy, getattr(stage, "ref_policy", None), getattr(stage, "critic", None)]
    check_sequence_length(policy_side, prompt + new, where)
    if stage.reward_cfg.unfinished == "with_eos":
        where += ", and the end a cut response gets (reward.unfinished: with_eos)"
    check_sequence_length(
        [getattr(stage, "reward_model", None)], prompt + new + (stage.reward_cfg.unfinished == "with_eos"), where
    )
    ptx = getattr(datamodule, "ptx_max_length", None)
    if stage.ppo.ptx_coef > 0 and isinstance(ptx, int):
        check_sequence_length([stage.policy], ptx, "--data.init_args.ptx_max_length")


def _option(group: Any, name: str) -> Any:
    """``name`` of a parsed option group: a mapping (jsonargparse's Namespace) or a config object."""
    return group.get(name) if hasattr(group, "get") else getattr(group, name, None)


def refusal_before_build(cls: type, init_args: Mapping[str, Any], plan: TrainerPlan) -> str | None:
    """``PPOModule.refusal_before_build`` (:meth:`~rlhf_lit.stages.base.StageModule.refusal_before_build`):
    ``--trainer.max_steps``, and compiled decoding or passes under FSDP (:func:`check_sharded_compile`).

    Under manual optimization ``global_step`` counts every ``opt.step()`` (epochs x minibatches per
    rollout, of every optimizer), so ``max_steps: 2`` would stop PPO inside its first rollout. Refused
    before the launcher starts the other processes (each would print it) and before any model is loaded.
    """
    if plan.max_steps not in (None, -1):
        return (
            f"--trainer.max_steps {plan.max_steps} counts optimizer steps, and a PPO rollout takes ppo.epochs x "
            "minibatches of them; set the run's length in rollouts with --model.init_args.max_rollouts instead"
        )
    decode = _option(init_args.get("sampling") or {}, "decode")
    forward = _option(init_args.get("ppo") or {}, "forward")
    try:
        check_sharded_compile(decode, forward, plan.shards_models)
        check_reward_model_head(init_args)
    except (ValueError, OSError) as refusal:
        return str(refusal)
    return None


def check_reward_model_head(init_args: Mapping[str, Any]) -> None:
    """Refuse a local ``reward_model`` that PPO scores with but that has no trained score head (a policy's
    export, a causal LM): loaded as a reward model it would get a new random head, and PPO would climb noise
    with no error (:func:`~rlhf_lit.evaluation.samples.check_reward_model`, as ``rlhf-lit evaluate`` refuses it).
    A reward model read only to start the critic, or given by name from the hub, is not checked here."""
    from rlhf_lit.evaluation.samples import NotARewardModel, check_reward_model

    path = init_args.get("reward_model")
    sources = _option(init_args.get("reward") or {}, "sources")
    # RewardConfig.uses_reward_model's rule, on the parsed options (no RewardConfig is built before the stage):
    # the default sources are the reward model; a source without a function is the reward model.
    scores_with_it = sources is None or any(_option(source, "function") is None for source in sources)
    if not (path and scores_with_it and os.path.isdir(os.path.expanduser(str(path)))):
        return
    try:
        check_reward_model(str(path), "--model.init_args.reward_model")
    except NotARewardModel:
        raise
    except (ValueError, OSError):
        pass  # a damaged config or manifest: the build's checks name the file, as for every model

"""Critic kinds, PPO-ptx, configuration errors and the frozen models left out of checkpoints."""

from __future__ import annotations

import re

import pytest
import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.plugins.precision import MixedPrecision
from ppo_helpers import STORIES, prompt_batch, tiny_module, tiny_trainer
from torch.utils.data import DataLoader

from rlhf_lit.callbacks import Checkpoint
from rlhf_lit.models import load_reward_model, sequence_scores
from rlhf_lit.models.generation import SamplingConfig
from rlhf_lit.models.lora import LoRAConfig
from rlhf_lit.models.memory import MemoryConfig
from rlhf_lit.models.value import SeparateCritic, ValueHead, build_critic
from rlhf_lit.stages.optim import OptimizerConfig
from rlhf_lit.stages.ppo import PPOModule
from rlhf_lit.stages.ppo.checks import check_whitening_rows
from rlhf_lit.stages.ppo.config import PPOConfig, RewardConfig
from rlhf_lit.tokenizer import load_tokenizer

PROMPTS = ["Once upon a time", "The", "Tom had a red", "A big dog"]


def test_separate_critic_starts_as_the_reward_model(tmp_path):
    tokenizer = load_tokenizer(STORIES, padding_side="left")
    torch.manual_seed(0)
    rm = load_reward_model(STORIES, tokenizer)
    rm.save_pretrained(tmp_path / "rm")  # a real RM checkpoint: its head is kept
    critic = build_critic("separate", None, str(tmp_path / "rm"), tokenizer)
    assert isinstance(critic, SeparateCritic)
    batch = prompt_batch(tokenizer, PROMPTS)
    with torch.no_grad():
        values = critic(batch["input_ids"], batch["attention_mask"])  # (B, T)
        torch.testing.assert_close(values[:, -1], sequence_scores(rm, batch["input_ids"], batch["attention_mask"]))
        # From a causal LM (no score head) the new head is zero: every value is 0.
        fresh = build_critic("separate", None, STORIES, tokenizer)
        assert torch.equal(fresh(batch["input_ids"], batch["attention_mask"]), torch.zeros_like(values))


def test_shared_trunk_head_trains_with_the_policy_in_one_optimizer(tmp_path):
    module = tiny_module(critic="shared_trunk", max_rollouts=1)
    assert isinstance(module.critic, ValueHead) and torch.equal(module.critic.head.weight, torch.zeros(1, 64))
    batch = prompt_batch(module.tokenizer, PROMPTS)
    trainer = tiny_trainer(tmp_path)
    trainer.fit(module, train_dataloaders=DataLoader([batch], batch_size=None))
    assert len(trainer.optimizers) == 1
    assert module.critic.head.weight.abs().sum() > 0  # the value loss reached the head
    assert trainer.logger.history[0]["loss/value"] > 0
    with pytest.raises(ValueError, match="critic_optimizer"):
        tiny_module(critic="shared_trunk", critic_optimizer=OptimizerConfig())


def test_checkpoint_leaves_out_frozen_models_and_keeps_ppo_state(tmp_path):
    module = tiny_module(max_rollouts=1)
    # last.ckpt as runs write it (at the end of training; a checkpoint saved after fit has no optimizer states).
    trainer = tiny_trainer(
        tmp_path, enable_checkpointing=True, callbacks=[Checkpoint(dirpath=tmp_path, save_last=True)]
    )
    trainer.fit(module, train_dataloaders=DataLoader([prompt_batch(module.tokenizer, PROMPTS)], batch_size=None))
    checkpoint = torch.load(tmp_path / "last.ckpt", weights_only=True)
    keys = checkpoint["state_dict"].keys()
    assert not any(k.startswith(("ref_policy.", "reward_model.")) for k in keys)
    assert any(k.startswith("policy.") for k in keys) and any(k.startswith("critic.") for k in keys)
    assert checkpoint["ppo"]["rollout_index"] == 1
    assert checkpoint["ppo"]["kl_controller"]["value"] == module.kl_ctl.value
    assert len(checkpoint["optimizer_states"]) == 2 and len(checkpoint["lr_schedulers"]) == 2
    assert isinstance(checkpoint["hyper_parameters"]["ppo"], dict)  # no dataclass: weights_only loads


class PtxData(LightningDataModule):
    """A stub data module: prompts for rollouts plus SFT-style batches for PPO-ptx (counts draws)."""

    def __init__(self, tokenizer):
        super().__init__()
        self.prompts = prompt_batch(tokenizer, PROMPTS)
        ids = torch.tensor([[1, 300, 301, 302, 2], [1, 310, 311, 2, 0]])
        self.sft = {
            "input_ids": ids,
            "attention_mask": torch.tensor([[1] * 5, [1, 1, 1, 1, 0]]),
            "labels": torch.tensor([[-100, -100, 301, 302, 2], [-100, -100, 311, 2, -100]]),
        }
        self.drawn = 0

    def train_dataloader(self):
        return DataLoader([self.prompts], batch_size=None)

    def ptx_dataloader(self):
        return self  # a short, re-iterable loader of 3 batches: PPO must cycle it

    def __iter__(self):
        for _ in range(3):
            self.drawn += 1
            yield self.sft


def test_ptx_loss_is_added_from_the_second_source(tmp_path):
    module = tiny_module(ppo=PPOConfig(epochs=2, minibatch_size=2, ptx_coef=0.5), max_rollouts=1)
    data = PtxData(module.tokenizer)
    trainer = tiny_trainer(tmp_path)
    trainer.fit(module, datamodule=data)
    assert data.drawn == 4  # one ptx batch per minibatch: 2 epochs x 2 minibatches, cycling a loader of 3
    assert trainer.logger.history[0]["loss/ptx"] > 0


def test_ptx_without_a_second_source_is_refused(tmp_path):
    module = tiny_module(ppo=PPOConfig(epochs=1, minibatch_size=2, ptx_coef=0.5), max_rollouts=1)
    with pytest.raises(ValueError, match="ptx_dataloader"):
        tiny_trainer(tmp_path).fit(
            module, train_dataloaders=DataLoader([prompt_batch(module.tokenizer, PROMPTS)], batch_size=None)
        )


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_rollouts": 0}, "^max_rollouts must be >= 1, got 0$"),
        ({"critic": "shared_trunk", "critic_optimizer": OptimizerConfig()}, "trains the head with the policy's optim"),
        ({"critic": "shared_trunk", "critic_lora": LoRAConfig()}, "^critic_lora applies to a separate critic"),
        ({"lora": LoRAConfig(dropout=0.1)}, r"^lora\.dropout must be 0 in PPO"),
        ({"trainable_layers": 0}, "^trainable_layers must be >= 1 or null, got 0$"),
        ({"trainable_layers": 1, "lora": LoRAConfig()}, "^trainable_layers and lora both choose what trains"),
        ({"reward_model": None}, r"^reward\.sources uses the reward model .*; set model\.reward_model$"),
        (
            {"sampling": SamplingConfig(ignore_eos=True), "reward": RewardConfig(missing_eos_penalty=-1.0)},
            "^sampling.ignore_eos: no response ends at EOS",
        ),
        (
            {
                "ppo": PPOConfig(forward="compiled"),
                "memory": MemoryConfig(gradient_checkpointing=True),
                "lora": LoRAConfig(),
            },
            "^ppo.forward: compiled does not run with memory.gradient_checkpointing and LoRA together",
        ),
        (
            {"ppo": PPOConfig(estimator="rloo"), "sampling": SamplingConfig(samples_per_prompt=2), "value_model": "v"},
            "^ppo.estimator='rloo' trains no critic; leave value_model at the default$",
        ),
    ],
)
def test_settings_that_contradict_each_other_are_refused_before_any_model_loads(settings, message):
    # The models' paths name nothing: a refusal that came after loading began would name them instead.
    with pytest.raises(ValueError, match=message):
        PPOModule(**{"sft_model": "./no/such/sft", "reward_model": "./no/such/rm", **settings})


@pytest.mark.parametrize("bad", [dict(epochs=0), dict(clip_range=0.0), dict(gamma=1.5), dict(max_grad_norm=0.0)])
def test_ppo_config_refuses_bad_values(bad):
    with pytest.raises(ValueError):
        PPOConfig(**bad)


def test_reward_config_shapes_scores_in_documented_order():
    raw, ended = torch.tensor([1.0, 3.0]), torch.tensor([True, False])
    # bias 1 -> [0, 2]; whiten: mean 1, unbiased std sqrt(2) -> [-1/sqrt(2), 1/sqrt(2)] = +-0.7071
    whitened = RewardConfig(bias=1.0, whiten="scores").shape(raw, ended)
    torch.testing.assert_close(whitened, torch.tensor([-0.70710678, 0.70710678]))
    # then clip 0.5 -> [-0.5, 0.5]; then row 1 has no EOS: replaced (not added) by -1 -> [-0.5, -1]
    shaped = RewardConfig(bias=1.0, whiten="scores", clip=0.5, missing_eos_penalty=-1.0).shape(raw, ended)
    assert shaped.tolist() == [-0.5, -1.0]


def _total_grad_norm(optimizer) -> float:
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item()


def test_gradients_are_clipped_after_fp16_unscaling(tmp_path):
    # A GradScaler multiplies the loss by 65536. Clipping before opt.step() would clip the scaled
    # gradients, so after unscaling the step would see max_grad_norm / 65536 = 1.5e-8.
    module = tiny_module(max_rollouts=1, ppo=PPOConfig(epochs=1, minibatch_size=4, max_grad_norm=1e-3))
    seen = []
    configure = module.configure_optimizers

    def recording_optimizers():
        optimizers, schedulers = configure()
        for opt in optimizers:  # the gradient norm the optimizer steps with
            opt.register_step_pre_hook(lambda o, args, kwargs: seen.append(_total_grad_norm(o)))
        return optimizers, schedulers

    module.configure_optimizers = recording_optimizers
    scaler = torch.amp.GradScaler("cpu")
    plugin = MixedPrecision("16-mixed", device="cpu", scaler=scaler)
    trainer = tiny_trainer(tmp_path, plugins=[plugin])
    trainer.fit(module, DataLoader([prompt_batch(module.tokenizer, PROMPTS)], batch_size=None))
    assert scaler.get_scale() == 65536.0  # no step was skipped for inf gradients
    # One step of each optimizer, each at exactly the clip norm (the raw norms are larger).
    assert seen == [pytest.approx(1e-3, rel=1e-3)] * 2


def test_before_fit_the_data_module_is_checked_against_what_the_stage_holds():
    # check_data_module(stage) reads the data module, the settings, the tokenizer, the stop ids and the reward
    # model's path of the stage: a chat-rendered prompt set needs a reward model with the policy's template,
    # and the prompts of a batch must split into whole optimizer steps.
    from types import SimpleNamespace

    from assets_paths import STORIES260K, STORIES260K_CHAT

    from rlhf_lit.stages.ppo.checks import check_data_module

    tokenizer = load_tokenizer(str(STORIES260K_CHAT), padding_side="left")
    data = SimpleNamespace(batch_size=4, chat_rendered=True, end_of_turn_id=lambda: tokenizer.eos_token_id)
    stage = SimpleNamespace(
        trainer=SimpleNamespace(datamodule=data),
        sampling=SamplingConfig(),
        ppo=PPOConfig(minibatch_size=4),
        reward_cfg=RewardConfig(),
        tokenizer=tokenizer,
        stop_ids=(tokenizer.eos_token_id,),
        hparams=SimpleNamespace(reward_model=str(STORIES260K)),
    )
    with pytest.raises(ValueError, match=f"^reward_model {re.escape(str(STORIES260K))}: its tokenizer has no chat"):
        check_data_module(stage)
    stage.hparams.reward_model = str(STORIES260K_CHAT)
    check_data_module(stage)  # the policy's template: nothing to refuse
    data.batch_size = 3
    with pytest.raises(ValueError, match=r"^the rollout batch \(3 prompts per process"):
        check_data_module(stage)


def test_whitening_with_one_prompt_is_refused():
    module = tiny_module()
    batch = prompt_batch(module.tokenizer, ["Once upon a time"])
    with pytest.raises(ValueError, match=r">= 2 prompts over all processes \(ppo.whiten_scope: global\)"):
        module.make_rollout(batch, timer=None)


def test_whitening_rows_are_counted_over_the_batch_the_statistic_covers():
    gae, scores_only = PPOConfig(), RewardConfig(whiten="scores")
    per_rank = PPOConfig(whiten_scope="rank")
    check_whitening_rows(1, 2, gae, RewardConfig())  # global: 1 prompt on each of 2 processes is 2 rows
    with pytest.raises(ValueError, match=">= 2 prompts over all processes"):
        check_whitening_rows(1, 1, PPOConfig(whiten_advantages=False), scores_only)
    with pytest.raises(ValueError, match=r">= 2 prompts per rank \(ppo.whiten_scope: rank\)"):
        check_whitening_rows(1, 2, per_rank, RewardConfig())
    check_whitening_rows(1, 1, PPOConfig(whiten_advantages=False), RewardConfig())  # nothing is whitened
    with pytest.raises(ValueError, match="ppo.whiten_scope must be one of global, rank; got 'all'"):
        PPOConfig(whiten_scope="all")


def test_compiled_decoding_is_refused_when_the_strategy_shards_the_models():
    """PPOModule's own check, for a Trainer built in code (the CLI refuses ``fsdp`` / ``fsdp2`` before
    anything is built: tests/cli/test_compiled_decode_cli.py; the decode path itself:
    tests/models/test_compiled_generation.py)."""
    module = tiny_module(sampling=SamplingConfig(max_new_tokens=12, decode="compiled"), max_rollouts=1)
    module._device_mesh = object()  # what the fsdp / fsdp2 strategy gives the module
    with pytest.raises(ValueError, match="^sampling.decode compiled is not supported under fsdp / fsdp2"):
        module.configure_model()

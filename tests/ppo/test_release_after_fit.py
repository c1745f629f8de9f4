"""What PPO frees at the end of fit (StageModule.release_after_fit): the frozen reference and reward
model and the optimizer states go before Lightning's teardown would copy them to host memory; the
policy, the critic, the export and ``last.ckpt`` are as training left them."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import Strategy
from ppo_helpers import prompt_batch, tiny_module, tiny_trainer
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM

from rlhf_lit.callbacks import Checkpoint
from rlhf_lit.models.lora import LoRAConfig
from rlhf_lit.models.memory import MemoryConfig, ReleasedError, teardown_bytes
from rlhf_lit.models.reference import AdapterDisabledReference
from rlhf_lit.stages.base import StageModule
from rlhf_lit.stages.resume import ResumeMismatch

PROMPTS = ["Once upon a time", "The cat", "Lily and Tom went", "A"]


def _loader(module) -> DataLoader:
    return DataLoader([prompt_batch(module.tokenizer, PROMPTS)], batch_size=None)


def _tensors(*modules) -> list[torch.Tensor]:
    """Every parameter and buffer of ``modules``, each tensor once."""
    unique = {}
    for module in modules:
        for t in (*module.parameters(), *module.buffers()):
            unique[id(t)] = t
    return list(unique.values())


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if not t.is_meta)


def _cloned(module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


class Snapshot(Callback):
    """At the callbacks' ``on_train_end`` (before the module's, which releases): what training left."""

    def on_train_end(self, trainer, pl_module) -> None:
        self.policy, self.critic = _cloned(pl_module.policy), _cloned(pl_module.critic)
        self.frozen = {
            name: {k: (v.shape, v.dtype) for k, v in getattr(pl_module, name).state_dict().items()}
            for name in ("ref_policy", "reward_model")
        }
        self.moments = [
            {k: v.clone() for k, v in state.items()} for opt in trainer.optimizers for state in opt.state.values()
        ]


class TeardownSpy:
    """Counts, when ``Strategy.teardown`` runs, the bytes it copies to the host on a GPU: the module's
    registered parameters and buffers, and the optimizer states (counted here on its own, and by
    :func:`teardown_bytes`, which the benchmark reports)."""

    def __init__(self, monkeypatch) -> None:
        self.seen: dict[str, int] = {}
        teardown = Strategy.teardown

        def spy(strategy) -> None:
            module, optimizers = strategy.lightning_module, strategy.optimizers
            states = [v for opt in optimizers for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
            self.seen = {
                "module": _nbytes(_tensors(module)),
                "optimizer_states": _nbytes(states),
                "reported": teardown_bytes(module, optimizers),
            }
            teardown(strategy)

        monkeypatch.setattr(Strategy, "teardown", spy)


@pytest.mark.parametrize("frozen_device", ["same", "cpu"])
def test_fit_releases_the_frozen_models_and_optimizer_states_and_keeps_what_users_read(tmp_path, frozen_device):
    module = tiny_module(max_rollouts=1, memory=MemoryConfig(frozen_device=frozen_device))
    snapshot = Snapshot()
    trainer = tiny_trainer(
        tmp_path, enable_checkpointing=True, callbacks=[snapshot, Checkpoint(dirpath=tmp_path / "ckpt", save_last=True)]
    )
    trainer.fit(module, train_dataloaders=_loader(module))
    assert snapshot.moments and all(len(m) > 0 for m in snapshot.moments)  # training had Adam moments

    # The frozen models: their structure on the meta device, no storage, out of the module's submodules.
    for name in ("ref_policy", "reward_model"):
        model = getattr(module, name)
        assert name not in module._modules and not any(n == name for n, _ in module.named_children())
        state = model.state_dict()
        assert {k: (v.shape, v.dtype) for k, v in state.items()} == snapshot.frozen[name]
        assert all(v.is_meta for v in state.values()) and all(t.is_meta for t in _tensors(model))
    assert module.reference.model is module.ref_policy  # the reference sees the same released model
    ids = prompt_batch(module.tokenizer, PROMPTS)
    with pytest.raises(
        ReleasedError, match=r"PPOModule\.ref_policy was released at the end of fit .*load_from_checkpoint"
    ):
        module.ref_policy(ids["input_ids"], attention_mask=ids["attention_mask"])
    with pytest.raises(ReleasedError, match=r"PPOModule\.reward_model was released at the end of fit"):
        module.score(ids["input_ids"], ids["attention_mask"])

    # The optimizer states are empty (their groups and hyperparameters stay).
    assert len(trainer.optimizers) == 2
    assert all(len(opt.state) == 0 and opt.param_groups[0]["params"] for opt in trainer.optimizers)

    # What users read is as training left it: the policy, the critic and the export.
    for model, before in ((module.policy, snapshot.policy), (module.critic, snapshot.critic)):
        after = model.state_dict()
        assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    exported = AutoModelForCausalLM.from_pretrained(module.exported_path).state_dict()
    assert all(torch.equal(exported[k], v) for k, v in snapshot.policy.items() if k in exported)
    assert "lm_head.weight" in exported and "model.embed_tokens.weight" in exported
    generated = module.generate(ids)  # the policy still samples
    assert generated.response_ids.shape[0] == len(PROMPTS)

    # last.ckpt was written before the release: it holds the moments training ended with.
    last = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    saved = [s for opt in last["optimizer_states"] for s in opt["state"].values()]
    assert len(saved) == len(snapshot.moments)
    assert all(
        torch.equal(s["exp_avg"], m["exp_avg"]) and torch.equal(s["exp_avg_sq"], m["exp_avg_sq"])
        for s, m in zip(saved, snapshot.moments)
    )

    # A checkpoint saved after fit holds the weights but no (emptied) optimizer states; a resume refuses it.
    trainer.save_checkpoint(tmp_path / "after.ckpt")
    after = torch.load(tmp_path / "after.ckpt", weights_only=True)
    assert "optimizer_states" not in after and any(k.startswith("policy.") for k in after["state_dict"])
    resumed = tiny_module(max_rollouts=2, memory=MemoryConfig(frozen_device=frozen_device))
    with pytest.raises(
        ResumeMismatch, match="the checkpoint holds no optimizer states .*resume from a checkpoint written during fit"
    ):
        tiny_trainer(tmp_path / "r").fit(resumed, train_dataloaders=_loader(resumed), ckpt_path=tmp_path / "after.ckpt")


def test_a_run_resumes_from_the_last_checkpoint_of_a_released_run(tmp_path):
    module = tiny_module(max_rollouts=1)
    trainer = tiny_trainer(
        tmp_path, enable_checkpointing=True, callbacks=[Checkpoint(dirpath=tmp_path / "ckpt", save_last=True)]
    )
    trainer.fit(module, train_dataloaders=_loader(module))
    resumed = tiny_module(max_rollouts=2)
    again = tiny_trainer(tmp_path / "r")
    again.fit(
        resumed,
        train_dataloaders=DataLoader([prompt_batch(resumed.tokenizer, PROMPTS)] * 2, batch_size=None),
        ckpt_path=tmp_path / "ckpt" / "last.ckpt",
    )
    assert resumed.rollout_index == 2 and list(again.logger.history) == [1]  # rollout 1 ran, from the moments kept


@pytest.mark.parametrize("release", ["released", "kept (before)"])
def test_the_teardown_copies_only_the_policy_and_the_critic(tmp_path, monkeypatch, release):
    spy = TeardownSpy(monkeypatch)
    if release == "kept (before)":  # how it was: the teardown copied all four models and both optimizers' states
        monkeypatch.setattr(StageModule, "release_after_fit", lambda self: None)
    module = tiny_module(max_rollouts=1)
    trainer = tiny_trainer(tmp_path)
    trainer.fit(module, train_dataloaders=_loader(module))
    trained = _nbytes(_tensors(module.policy, module.critic))  # each float32 weight once: 4 bytes
    assert trained == 4 * sum(p.numel() for p in _tensors(module.policy, module.critic))
    assert spy.seen["reported"] == {"module": spy.seen["module"], "optimizer_states": spy.seen["optimizer_states"]}
    if release == "released":
        assert spy.seen == {"module": trained, "optimizer_states": 0, "reported": spy.seen["reported"]}
        return
    frozen = _nbytes(_tensors(module.ref_policy, module.reward_model))
    assert frozen > 0 and spy.seen["module"] == trained + frozen
    # Adam: exp_avg and exp_avg_sq of every trained parameter (plus a scalar step each).
    trainable = sum(4 * p.numel() for opt in trainer.optimizers for g in opt.param_groups for p in g["params"])
    steps = sum(len(g["params"]) for opt in trainer.optimizers for g in opt.param_groups)
    assert spy.seen["optimizer_states"] == 2 * trainable + 4 * steps


def test_lora_keeps_its_reference_and_releases_the_reward_model(tmp_path):
    module = tiny_module(max_rollouts=1, lora=LoRAConfig(r=4))
    trainer = tiny_trainer(tmp_path)
    trainer.fit(module, train_dataloaders=_loader(module))
    assert isinstance(module.reference, AdapterDisabledReference) and not hasattr(module, "ref_policy")
    assert all(t.is_meta for t in _tensors(module.reward_model))
    generated = module.generate(prompt_batch(module.tokenizer, PROMPTS))
    ref = module.reference.logprobs(generated, module.sampling.temperature)  # the policy's base weights: intact
    assert ref.shape == generated.response_ids.shape and torch.isfinite(ref).all()

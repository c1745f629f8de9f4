"""PPO with a LoRA policy: the reference is the policy with its adapters disabled (no second copy of
the SFT model), only adapters train, exports load, resume is exact, gradient checkpointing is
really active in the update, the frozen models may live on the CPU / in bfloat16, and it learns."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from ppo_helpers import STORIES, TINYSTORIES, assert_resumes_exactly, prompt_batch, tiny_module, tiny_trainer
from transformers import AutoModelForCausalLM

from rlhf_lit.data import PromptDataModule
from rlhf_lit.models import load_causal_lm
from rlhf_lit.models.lora import LoRAConfig
from rlhf_lit.models.memory import MemoryConfig
from rlhf_lit.models.reference import AdapterDisabledReference, FrozenModelReference
from rlhf_lit.models.teacher_forced import forward_with_positions, response_logprobs
from rlhf_lit.stages.optim import OptimizerConfig

PROMPTS = ["Once upon a time", "The cat sat", "Tom and his dog went to the park", "She was"]
LORA = LoRAConfig(r=8, alpha=16.0)
FAST = OptimizerConfig(lr=3e-3, eps=1e-5)  # adapters start at 0: a large LR so they move in 2 rollouts


def _data(module, batch_size=4, seed=3):
    return PromptDataModule(
        tokenizer=module.tokenizer,
        train_path=TINYSTORIES,
        format="paragraphs",
        max_records=16,
        batch_size=batch_size,
        seed=seed,
    )


def _n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_lora_ppo_holds_no_copy_of_the_sft_model():
    plain, lora = tiny_module(), tiny_module(lora=LORA)
    assert isinstance(plain.reference, FrozenModelReference) and isinstance(lora.reference, AdapterDisabledReference)
    assert not hasattr(lora, "ref_policy")
    sft_size = _n_params(plain.ref_policy)
    adapters = sum(p.numel() for n, p in lora.policy.named_parameters() if "lora_" in n)
    # Policy + RM + critic, plus the adapters: one SFT model fewer than without LoRA.
    assert _n_params(lora) == _n_params(plain) - sft_size + adapters
    assert not any(k.startswith("ref_policy.") for k in lora.state_dict())


def test_reference_stays_the_sft_model_while_the_adapter_trains(tmp_path):
    module = tiny_module(lora=LORA, max_rollouts=2, optimizer=FAST)
    sft = load_causal_lm(STORIES, module.tokenizer)
    base_before = {n: p.detach().clone() for n, p in module.policy.named_parameters() if "lora_" not in n}
    tiny_trainer(tmp_path).fit(module, _data(module))
    module.eval()
    # The adapter moved (B starts at 0) ...
    assert any(p.abs().max() > 0 for n, p in module.policy.named_parameters() if "lora_B" in n)
    # ... every base weight is bit-identical and never got a gradient ...
    for name, p in module.policy.named_parameters():
        if "lora_" not in name:
            assert torch.equal(p, base_before[name]), name
            assert p.grad is None and not p.requires_grad, name
    # ... and the reference logprobs equal the SFT model's exactly (fp32), while the policy's moved.
    batch = prompt_batch(module.tokenizer, PROMPTS)
    gen = module.generate(batch)
    with torch.enable_grad():  # even with gradients on, the reference builds no graph
        ref = module.reference.logprobs(gen, module.sampling.temperature)
    assert not ref.requires_grad
    with torch.no_grad():
        expected = response_logprobs(sft, gen, module.sampling.temperature)
        policy = response_logprobs(module.policy, gen, module.sampling.temperature)
    assert torch.equal(ref, expected)
    assert (policy - expected).abs().max() > 1e-3


@pytest.mark.parametrize("export", ["merged", "adapter"])
def test_lora_ppo_export_loads_and_gives_the_live_logits(tmp_path, export):
    module = tiny_module(
        lora=LoRAConfig(export=export), max_rollouts=2, optimizer=FAST, export_dir=str(tmp_path / "policy")
    )
    tiny_trainer(tmp_path).fit(module, _data(module))
    batch = prompt_batch(module.tokenizer, PROMPTS)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    if export == "merged":
        exported = AutoModelForCausalLM.from_pretrained(tmp_path / "policy").eval()
    else:
        from peft import AutoPeftModelForCausalLM

        exported = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "policy").eval()
    with torch.no_grad():
        live = forward_with_positions(module.policy, ids, mask).logits
        got = forward_with_positions(exported, ids, mask).logits
        sft = forward_with_positions(load_causal_lm(STORIES, module.tokenizer), ids, mask).logits
    if export == "merged":  # merged weights: the last bits differ from base + adapter path (fp32)
        torch.testing.assert_close(got, live, rtol=0, atol=1e-4)
    else:
        assert torch.equal(got, live)
    assert (live - sft).abs().max() > 1e-2  # it is the trained policy


def test_lora_ppo_resumes_exactly(tmp_path):
    steps_per_rollout = 8  # 2 epochs x 2 minibatches x 2 optimizers
    kwargs = dict(lora=LORA, critic_lora=LoRAConfig(r=4), max_rollouts=3, optimizer=FAST)
    straight = tiny_module(**kwargs)
    ckpt = ModelCheckpoint(
        dirpath=tmp_path / "ckpt", every_n_train_steps=steps_per_rollout, save_top_k=-1, filename="{step}"
    )
    trainer = tiny_trainer(tmp_path, enable_checkpointing=True, callbacks=[ckpt])
    trainer.fit(straight, _data(straight))
    saved = torch.load(tmp_path / "ckpt" / f"step={steps_per_rollout}.ckpt", weights_only=True)
    assert any("lora_A" in k for k in saved["state_dict"])
    assert not any(k.startswith(("ref_policy.", "reward_model.")) for k in saved["state_dict"])
    resumed = tiny_module(**kwargs)
    assert_resumes_exactly(straight, resumed, _data(resumed), tmp_path, f"step={steps_per_rollout}.ckpt")


def _block_calls(tmp_path, **kwargs) -> tuple[int, int]:
    """Forward calls of the first MLP of the policy and of the separate critic during a one-rollout fit."""
    module = tiny_module(max_rollouts=1, **kwargs)
    calls = {"policy": [], "critic": []}
    # Pre-hooks: recomputation stops early once the saved tensors are back (see tests/models/test_lora.py).
    module.policy.model.layers[0].mlp.register_forward_pre_hook(lambda *args: calls["policy"].append(1))
    module.critic.model.model.layers[0].mlp.register_forward_pre_hook(lambda *args: calls["critic"].append(1))
    tiny_trainer(tmp_path).fit(module, _data(module))
    return len(calls["policy"]), len(calls["critic"])


@pytest.mark.parametrize("lora", [None, LORA], ids=["full", "lora"])
def test_gradient_checkpointing_recomputes_policy_and_critic_in_every_update(tmp_path, lora):
    plain = _block_calls(tmp_path / "plain", lora=lora, critic_lora=lora)
    checkpointed = _block_calls(
        tmp_path / "gc", lora=lora, critic_lora=lora, memory=MemoryConfig(gradient_checkpointing=True)
    )
    # Same samples (same seeds); each of the 2 epochs x 2 minibatches recomputes the block once in
    # its backward pass, in the policy and in the critic. Generation and the no-grad scoring passes
    # are not checkpointed (eval mode).
    assert (checkpointed[0] - plain[0], checkpointed[1] - plain[1]) == (2 * 2, 2 * 2)


def test_frozen_models_in_bfloat16_on_the_cpu(tmp_path):
    module = tiny_module(memory=MemoryConfig(frozen_device="cpu", frozen_dtype="bfloat16"), max_rollouts=1)
    assert module.ref_policy.dtype == torch.bfloat16 and module.reward_model.dtype == torch.bfloat16
    assert module.policy.dtype == torch.float32
    assert "reward_model" not in module._modules and "ref_policy" not in module._modules  # never moved
    tiny_trainer(tmp_path).fit(module, _data(module))
    assert module.rollout_index == 1


def test_ppo_refuses_lora_dropout_and_critic_lora_on_a_shared_trunk():
    with pytest.raises(ValueError, match="lora.dropout must be 0 in PPO"):
        tiny_module(lora=LoRAConfig(dropout=0.1))
    with pytest.raises(ValueError, match="critic_lora applies to a separate critic"):
        tiny_module(critic="shared_trunk", critic_lora=LORA)


def test_shared_trunk_value_head_on_a_lora_policy(tmp_path):
    module = tiny_module(lora=LORA, critic="shared_trunk", max_rollouts=2, optimizer=FAST)
    head_before = module.critic.head.weight.detach().clone()
    tiny_trainer(tmp_path).fit(module, _data(module))
    (optimizer,) = [module.optimizers()] if not isinstance(module.optimizers(), list) else module.optimizers()
    trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
    names = [n for n, p in module.named_parameters() if id(p) in trained]
    assert names and all("lora_" in n or n.startswith("critic.head.") for n in names)
    assert not torch.equal(module.critic.head.weight, head_before)

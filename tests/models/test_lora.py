"""LoRA (rlhf_lit.models.lora) and the memory levers (rlhf_lit.models.memory) on tiny real models.

Each test guards one promise: defaults chosen by name pattern, one message per bad option, only
adapters (and an RM's head) trainable, the adapter-disabled model is exactly the base model, the
exports load in plain transformers / peft with the live model's logits, gradient checkpointing
really recomputes blocks (counted), frozen models kept on the CPU stay out of the module.
"""

from __future__ import annotations

import copy

import pytest
import torch
from assets_paths import STORIES260K
from transformers import AutoModelForCausalLM, GPTNeoXConfig, GPTNeoXForCausalLM

from rlhf_lit.models import load_causal_lm, load_reward_model, sequence_scores
from rlhf_lit.models.lora import (
    LoRAConfig,
    adapter_disabled,
    default_target_modules,
    export_parts,
    exportable,
    with_lora,
)
from rlhf_lit.models.memory import (
    MemoryConfig,
    attach_frozen,
    call_on_own_device,
    enable_gradient_checkpointing,
    train_mode,
)
from rlhf_lit.models.teacher_forced import forward_with_positions
from rlhf_lit.stages.export import MARKER, save_pretrained_atomically
from rlhf_lit.tokenizer import load_tokenizer

STORIES = str(STORIES260K)
LLAMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(STORIES)


def _tokens(n_rows=3, length=12, seed=0):
    ids = torch.randint(3, 500, (n_rows, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # a left-padded row: positions from the mask
    return ids, mask


def _move_adapters(model: torch.nn.Module, seed=1) -> None:
    """An adapter update stand-in: B starts at 0 (adapter = no-op); random B makes it count."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def _logits(model, ids, mask):
    with torch.no_grad():
        return forward_with_positions(model, ids, mask).logits


# ------------------------------------------------------------------ targets and options
def test_default_targets_follow_the_architecture(tokenizer, gpt2_dir):
    assert default_target_modules(load_causal_lm(STORIES, tokenizer)) == LLAMA_TARGETS
    assert default_target_modules(load_causal_lm(gpt2_dir)) == ["c_attn", "c_proj", "c_fc"]
    # Neither pattern: every linear layer except the output head (GPT-NeoX's embed_out).
    config = GPTNeoXConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    neox = GPTNeoXForCausalLM(config)
    assert default_target_modules(neox) == ["dense", "dense_4h_to_h", "dense_h_to_4h", "query_key_value"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(r=0), "lora.r must be an integer >= 1"),
        (dict(alpha=0.0), "lora.alpha must be > 0"),
        (dict(dropout=1.0), "lora.dropout must be in [0, 1)"),
        (dict(export="full"), "lora.export must be 'merged' or 'adapter'"),
        (dict(target_modules=[]), "lora.target_modules must be null or a non-empty list"),
    ],
)
def test_bad_options_name_the_option(options, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        LoRAConfig(**options)


def test_unknown_target_names_the_option_and_the_layers(tokenizer):
    model = load_causal_lm(STORIES, tokenizer)
    with pytest.raises(
        ValueError,
        match=r"lora.target_modules: no module of LlamaForCausalLM matches 'c_attn' "
        r"\(its linear layers are named: down_proj, gate_proj",
    ):
        with_lora(model, LoRAConfig(target_modules=["q_proj", "c_attn"]), "causal_lm")
    with pytest.raises(ValueError, match="lora.target_modules: 'input_layernorm' names a LlamaRMSNorm"):
        with_lora(model, LoRAConfig(target_modules=["input_layernorm"]), "causal_lm")


def test_an_adapter_on_a_tied_embedding_or_head_is_merged_into_an_untied_copy():
    """A tied input embedding / LM head is one weight under two modules; peft adapts only the one named,
    so the merged export must untie them to be the trained model (SmolLM2 itself in
    tests/realmodel/test_smollm2_lora.py). Default targets keep the export tied."""
    from float32_bounds import output_bound
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    ids = torch.tensor([[1, 5, 9, 33, 63, 2]])
    for targets, tied in ((["embed_tokens"], False), (["lm_head"], False), (None, True)):
        torch.manual_seed(0)
        model = with_lora(LlamaForCausalLM(config), LoRAConfig(target_modules=targets), "causal_lm").eval()
        for name, param in model.named_parameters():
            if "lora_" in name:
                torch.nn.init.normal_(param, std=0.5)  # far from the identity start
        with torch.no_grad():
            live = model(input_ids=ids).logits
        # x W + s (x A) B against x (W + s B A): another order of the same sums (tests/float32_bounds.py)
        bound = output_bound(config, float(live.abs().max()), ids.shape[1])
        # The unsharded export and the sharded one's path (rebuilt around gathered weights, then merged)
        gathered = {k: v.detach().clone() for k, v in model.state_dict().items()}
        for merged in (exportable(model), export_parts(model, gathered)[0]):
            assert merged.config.tie_word_embeddings == tied
            assert (merged.lm_head.weight is merged.get_input_embeddings().weight) == tied
            with torch.no_grad():
                torch.testing.assert_close(merged(input_ids=ids).logits, live, rtol=0, atol=bound)
        assert model.lm_head.weight is model.get_input_embeddings().weight  # the live model is left tied


def test_none_leaves_the_model_untouched(tokenizer):
    model = load_causal_lm(STORIES, tokenizer)
    assert with_lora(model, None, "causal_lm") is model
    assert all(p.requires_grad for p in model.parameters())
    with pytest.raises(ValueError, match="no LoRA adapter to disable"):
        with adapter_disabled(model):
            pass


# ------------------------------------------------------------------ what trains
def test_only_adapters_train_in_a_policy_and_adapters_plus_head_in_a_reward_model(tokenizer):
    policy = with_lora(load_causal_lm(STORIES, tokenizer), LoRAConfig(r=4), "causal_lm")
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # one A and one B per target module in each of the 5 layers
    assert len(trainable) == 2 * len(LLAMA_TARGETS) * 5
    reward = with_lora(load_reward_model(STORIES, tokenizer), LoRAConfig(r=4), "reward")
    trainable = [n for n, p in reward.named_parameters() if p.requires_grad]
    assert [n for n in trainable if "lora_" not in n] == ["score.weight"]


def test_adapter_disabled_is_exactly_the_base_model(tokenizer):
    base = load_causal_lm(STORIES, tokenizer)
    policy = with_lora(copy.deepcopy(base), LoRAConfig(), "causal_lm")
    _move_adapters(policy)
    ids, mask = _tokens()
    expected = _logits(base, ids, mask)
    assert not torch.allclose(_logits(policy, ids, mask), expected)  # the adapter counts
    with adapter_disabled(policy):
        assert torch.equal(_logits(policy, ids, mask), expected)  # fp32: bit for bit
    assert not torch.allclose(_logits(policy, ids, mask), expected)  # back on after the block


def test_adapter_disabled_unfreezes_the_parameters_it_froze_when_fsdp_swapped_them(tokenizer):
    # peft freezes the adapters on entry and unfreezes, on exit, the parameters a layer holds then.
    # FSDP2 swaps a unit's registered parameters between its shards and a gathered copy (a root unit
    # stays gathered after a no-grad pass): the shards frozen on entry must train again after.
    policy = with_lora(load_causal_lm(STORIES, tokenizer), LoRAConfig(r=2), "causal_lm")
    adapter = policy.model.layers[0].self_attn.q_proj.lora_A["default"]
    shard = adapter.weight
    with adapter_disabled(policy):
        assert not shard.requires_grad
        adapter.weight = torch.nn.Parameter(shard.detach().clone(), requires_grad=False)  # the gathered copy
    assert adapter.weight.requires_grad and shard.requires_grad


# ------------------------------------------------------------------ exports
def test_merged_export_loads_in_plain_transformers_with_the_live_logits(tmp_path, tokenizer):
    policy = with_lora(load_causal_lm(STORIES, tokenizer), LoRAConfig(), "causal_lm")
    _move_adapters(policy)
    ids, mask = _tokens()
    live = _logits(policy, ids, mask)
    save_pretrained_atomically(exportable(policy), tokenizer, tmp_path / "merged", "policy")
    assert (tmp_path / "merged" / MARKER).is_file()
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert not any("lora" in n for n in exported.state_dict())
    # Merged W + (alpha/r) B A differs from the two-path sum in the last bits only (fp32).
    torch.testing.assert_close(_logits(exported, ids, mask), live, rtol=0, atol=1e-4)
    # The live model was not merged: its adapters are still separate and give the same logits.
    assert torch.equal(_logits(policy, ids, mask), live)
    with adapter_disabled(policy):
        assert not torch.allclose(_logits(policy, ids, mask), live, atol=1e-3)


def test_adapter_export_loads_with_peft_and_matches(tmp_path, tokenizer):
    from peft import AutoPeftModelForCausalLM, PeftModel

    policy = with_lora(load_causal_lm(STORIES, tokenizer), LoRAConfig(r=4, export="adapter"), "causal_lm")
    _move_adapters(policy)
    ids, mask = _tokens()
    live = _logits(policy, ids, mask)
    save_pretrained_atomically(exportable(policy), tokenizer, tmp_path / "adapter", "policy")
    files = {p.name for p in (tmp_path / "adapter").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", MARKER} <= files
    assert "model.safetensors" not in files  # the adapter only
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(STORIES), tmp_path / "adapter").eval()
    assert torch.equal(_logits(loaded, ids, mask), live)
    auto = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "adapter").eval()  # base found by absolute path
    assert torch.equal(_logits(auto, ids, mask), live)


# ------------------------------------------------------------------ memory levers
def _count_block_forwards(model, train: bool) -> int:
    """Forward calls of the first block's MLP during one forward + backward."""
    calls = []
    mlp = model.model.layers[0].mlp
    # A pre-hook: the recomputation stops as soon as the saved tensors are back (early stop), so a
    # post-forward hook of the last module in a block may never fire during it.
    handle = mlp.register_forward_pre_hook(lambda *args: calls.append(1))
    ids, mask = _tokens()
    context = train_mode(model) if train else torch.enable_grad()
    with context:
        loss = forward_with_positions(model, ids, mask).logits.float().pow(2).mean()
    loss.backward()
    handle.remove()
    return len(calls)


@pytest.mark.parametrize("lora", [None, LoRAConfig(r=4)], ids=["full", "lora"])
def test_gradient_checkpointing_recomputes_blocks_in_train_mode(tokenizer, lora):
    plain = with_lora(load_causal_lm(STORIES, tokenizer), lora, "causal_lm")
    checkpointed = copy.deepcopy(plain)
    enable_gradient_checkpointing(checkpointed)
    assert _count_block_forwards(plain, train=True) == 1
    # Recomputed in the backward pass: the block runs twice. Models load in eval mode, where Hugging
    # Face does not checkpoint: that is why the update passes run under train_mode.
    assert _count_block_forwards(checkpointed, train=True) == 2
    assert _count_block_forwards(checkpointed, train=False) == 1
    # Same gradients either way (dropout is off; recomputation is exact in fp32).
    for model in (plain, checkpointed):
        model.zero_grad()
        _count_block_forwards(model, train=True)
    for (name, p), q in zip(plain.named_parameters(), checkpointed.parameters()):
        if p.requires_grad:
            torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=name)
    assert not checkpointed.training  # train_mode restored the eval mode


def test_frozen_on_cpu_stays_out_of_the_module_and_its_moves(tokenizer):
    owner = torch.nn.Module()
    same, cpu = load_reward_model(STORIES, tokenizer), load_reward_model(STORIES, tokenizer)
    attach_frozen(owner, "same", same, "same")
    attach_frozen(owner, "cpu", cpu, "cpu")
    assert "same" in owner._modules and "cpu" not in owner._modules
    assert not any(k.startswith("cpu.") for k in owner.state_dict())
    owner.double()  # stands in for the Trainer's move to an accelerator
    assert owner.same.score.weight.dtype == torch.float64
    assert owner.cpu.score.weight.dtype == torch.float32  # not moved
    ids, mask = _tokens()
    torch.testing.assert_close(
        call_on_own_device(sequence_scores, owner.cpu, ids, mask), sequence_scores(cpu, ids, mask), rtol=0, atol=0
    )


def test_memory_options_are_checked():
    with pytest.raises(ValueError, match="memory.frozen_device must be 'same' or 'cpu'"):
        MemoryConfig(frozen_device="gpu")
    with pytest.raises(ValueError, match="memory.frozen_dtype must be"):
        MemoryConfig(frozen_dtype="int8")

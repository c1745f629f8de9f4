"""trainable_layers: only the top blocks and what follows them train; nothing below gets a gradient."""

from __future__ import annotations

import pytest
import torch

from rlhf_lit.models import load_causal_lm, load_reward_model
from rlhf_lit.models.freezing import (
    check_frozen_modules,
    check_trainable_layers,
    freeze_lower_layers,
    freeze_modules,
    transformer_blocks,
)
from rlhf_lit.models.lora import LoRAConfig
from rlhf_lit.tokenizer import load_tokenizer


def _trainable(model) -> set[str]:
    return {n for n, p in model.named_parameters() if p.requires_grad}


def test_the_top_blocks_and_the_final_norm_train_embeddings_and_lower_blocks_do_not(stories_path):
    tok = load_tokenizer(stories_path)
    model = freeze_lower_layers(load_causal_lm(stories_path, tok), 2)
    assert len(transformer_blocks(model)) == 5  # stories260K: model.layers, 5 blocks
    trainable = _trainable(model)
    # By name: blocks 3 and 4 and the final norm; never block 2, the embeddings or the head tied to them.
    assert {n.split(".")[2] for n in trainable if n.startswith("model.layers.")} == {"3", "4"}
    assert "model.norm.weight" in trainable
    assert not any(n.startswith(("model.embed_tokens", "lm_head")) for n in trainable)
    ids = torch.tensor([[1, 20, 30, 40, 50]])
    model(input_ids=ids, labels=ids).loss.backward()
    for name, p in model.named_parameters():
        assert (p.grad is not None) == (name in trainable), name
    assert model.model.layers[3].self_attn.q_proj.weight.grad.abs().sum() > 0


def test_a_reward_models_score_head_trains(stories_path):
    tok = load_tokenizer(stories_path)
    model = freeze_lower_layers(load_reward_model(stories_path, tok), 1)
    assert _trainable(model) >= {"score.weight", "model.norm.weight"}
    assert {n.split(".")[2] for n in _trainable(model) if n.startswith("model.layers.")} == {"4"}


def test_nothing_changes_without_it_and_bad_counts_are_refused(stories_path):
    tok = load_tokenizer(stories_path)
    model = load_causal_lm(stories_path, tok)
    before = _trainable(model)
    assert freeze_lower_layers(model, None) is model and _trainable(model) == before
    with pytest.raises(ValueError, match="between 1 and the model's 5 transformer blocks, got 6"):
        freeze_lower_layers(model, 6)
    with pytest.raises(ValueError, match="trainable_layers must be >= 1 or null, got 0"):
        check_trainable_layers(0)
    with pytest.raises(ValueError, match="trainable_layers and lora both choose what trains"):
        check_trainable_layers(2, lora=LoRAConfig(r=4))


@pytest.mark.parametrize("kind", ["bloom", "opt"])
def test_what_runs_before_the_blocks_is_frozen_too(kind):
    # BLOOM normalises its embeddings and OPT-350m projects them in before block 0: neither may train,
    # or the backward pass would run through every frozen block to reach them.
    from transformers import BloomConfig, BloomForCausalLM, OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    if kind == "bloom":
        model, before = (
            BloomForCausalLM(BloomConfig(vocab_size=64, hidden_size=16, n_layer=3, n_head=2)),
            "word_embeddings_layernorm",
        )
    else:
        config = OPTConfig(
            vocab_size=64,
            hidden_size=16,
            num_hidden_layers=3,
            num_attention_heads=2,
            ffn_dim=32,
            word_embed_proj_dim=8,
            max_position_embeddings=32,
        )
        model, before = OPTForCausalLM(config), "project_in"
    freeze_lower_layers(model, 1)
    assert not any(before in n for n in _trainable(model))
    ids = torch.tensor([[1, 5, 7, 9]])
    model(input_ids=ids, labels=ids).loss.backward()
    lower = [n for n, p in model.named_parameters() if p.grad is not None and (before in n or ".0." in n or ".1." in n)]
    assert lower == []
    assert any(p.grad is not None for n, p in model.named_parameters() if ".2." in n)


def test_frozen_modules_freeze_what_they_name_by_full_name_or_dotted_suffix(stories_path):
    tok = load_tokenizer(stories_path)
    model = freeze_modules(freeze_lower_layers(load_causal_lm(stories_path, tok), 2), ["layers.4.mlp"])
    trainable = _trainable(model)
    assert not any(n.startswith("model.layers.4.mlp.") for n in trainable)
    assert {"model.layers.4.self_attn.q_proj.weight", "model.layers.3.mlp.up_proj.weight"} <= trainable
    ids = torch.tensor([[1, 20, 30, 40, 50]])
    model(input_ids=ids, labels=ids).loss.backward()
    for name, p in model.named_parameters():
        assert (p.grad is not None) == (name in trainable), name
    every = freeze_modules(load_causal_lm(stories_path, tok), ["mlp", "model.layers.0.self_attn"])
    frozen = {n for n, p in every.named_parameters() if not p.requires_grad}
    assert {n for n in frozen if ".mlp." in n} == {n for n, _ in every.named_parameters() if ".mlp." in n}
    assert {n for n in frozen if ".mlp." not in n} == {
        f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkvo"
    }  # a full name; "lp" or "layers.4.ml" would be a part of a word, not a module's name


def test_frozen_modules_refusals(stories_path):
    tok = load_tokenizer(stories_path)
    model = load_causal_lm(stories_path, tok)
    before = _trainable(model)
    assert freeze_modules(model, None) is model and freeze_modules(model, []) is model and _trainable(model) == before
    with pytest.raises(
        ValueError, match=r"frozen_modules: no module of LlamaForCausalLM is named 'lp' .*'layers.4.mlp'"
    ):
        freeze_modules(model, ["lp"])
    with pytest.raises(ValueError, match="'layers.0.mlp' names no parameter that trains"):
        freeze_modules(freeze_lower_layers(load_causal_lm(stories_path, tok), 2), ["layers.0.mlp"])
    with pytest.raises(ValueError, match="'act_fn' names no parameter that trains"):
        freeze_modules(model, ["act_fn"])
    with pytest.raises(ValueError, match="leaves nothing of LlamaForCausalLM to train"):
        freeze_modules(model, ["model"])
    with pytest.raises(ValueError, match="frozen_modules must be null or a list of module names, got 'mlp'"):
        check_frozen_modules("mlp")
    with pytest.raises(ValueError, match="frozen_modules and lora both choose what trains"):
        check_frozen_modules(["mlp"], lora=LoRAConfig(r=4))
    check_frozen_modules(["mlp"], lora=None)

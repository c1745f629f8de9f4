"""bench/chat_kl_layers.py: a policy's changed tensors set back group by group, on tiny models by hand.

The groups are checked on two architectures' own names (Llama's ``self_attn`` / ``mlp`` /
``*_layernorm``, GPT-2's ``attn`` / ``mlp`` / ``ln_*``); the hybrids on a tiny Llama whose "policy" is the
reference with three tensors moved by a known amount, through a fake evaluation that reports, as its "KL",
how many tensors of the saved hybrid differ from the reference: so the folder the evaluation reads must be
the hybrid with exactly that group set back.
"""

from __future__ import annotations

import math
import shutil
import sys

import pytest
import torch
from assets_paths import ROOT, STORIES260K

sys.path.insert(0, str(ROOT / "bench"))
from chat_kl_layers import changed_tensors, measure_hybrids, paired_gain, parameter_groups, reverted_state  # noqa: E402


def tiny_llama():
    """A 2-block Llama (hidden 16), seed 0."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, max_position_embeddings=64, tie_word_embeddings=True,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def test_groups_of_a_llama_by_hand():
    groups = parameter_groups(tiny_llama())
    assert groups["block 1"] == [n for n in groups["block 1"] if n.startswith("model.layers.1.")]
    assert len(groups["block 0"]) == len(groups["block 1"]) == 9  # q k v o, gate up down, two norms
    assert sorted(groups["attention"]) == sorted(
        f"model.layers.{i}.self_attn.{p}_proj.weight" for i in (0, 1) for p in "qkvo"
    )
    assert sorted(groups["mlp"]) == sorted(
        f"model.layers.{i}.mlp.{p}_proj.weight" for i in (0, 1) for p in ("gate", "up", "down")
    )
    assert sorted(groups["block norms"]) == sorted(
        f"model.layers.{i}.{n}.weight" for i in (0, 1) for n in ("input_layernorm", "post_attention_layernorm")
    )
    assert sorted(groups["outside the blocks"]) == ["model.embed_tokens.weight", "model.norm.weight"]


def test_groups_of_a_gpt2_partition_its_parameters():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=3, n_head=2, vocab_size=64, n_positions=32))
    groups = parameter_groups(model)
    parts = [groups[g] for g in ("attention", "mlp", "block norms", "outside the blocks")]
    names = [n for n, _ in model.named_parameters()]
    assert sorted(sum(parts, [])) == sorted(names)  # every parameter in exactly one part
    assert "transformer.h.2.attn.c_attn.weight" in groups["attention"]
    assert "transformer.h.2.mlp.c_fc.weight" in groups["mlp"]
    assert "transformer.h.2.ln_1.weight" in groups["block norms"] and "transformer.h.2.ln_1.weight" in groups["block 2"]
    assert (
        "transformer.wpe.weight" in groups["outside the blocks"]
        and "transformer.ln_f.weight" in groups["outside the blocks"]
    )


def test_changed_tensors_and_their_relative_change():
    reference = {"a": torch.tensor([3.0, 4.0]), "b": torch.ones(2)}
    policy = {"a": torch.tensor([3.0, 4.5]), "b": torch.ones(2)}
    assert changed_tensors(policy, reference) == pytest.approx({"a": 0.5 / 5.0})
    with pytest.raises(ValueError, match="a: the policy's shape"):
        changed_tensors({"a": torch.zeros(3)}, reference)


def test_reverted_state_sets_back_only_the_named_tensors():
    reference = {"a": torch.zeros(2), "b": torch.zeros(2)}
    policy = {"a": torch.ones(2), "b": torch.ones(2)}
    out = reverted_state(policy, reference, ["b"])
    assert torch.equal(out["a"], torch.ones(2)) and torch.equal(out["b"], torch.zeros(2))
    out["b"] += 5
    assert torch.equal(reference["b"], torch.zeros(2))  # a copy, not the reference's tensor


def test_paired_gain_by_hand():
    base = [{"prompt_index": 0, "judge": 0.1}, {"prompt_index": 1, "judge": 0.5}]
    samples = [{"prompt_index": 1, "judge": 0.9}, {"prompt_index": 0, "judge": 0.2}]
    gain = paired_gain(samples, base)  # differences 0.4 and 0.1: mean 0.25, s.e. 0.15
    assert gain["mean"] == pytest.approx(0.25) and gain["stderr"] == pytest.approx(0.15)
    with pytest.raises(ValueError, match=r"requests \[7\]"):
        paired_gain([{"prompt_index": 7, "judge": 0.0}], base)


def test_each_hybrid_is_the_policy_with_its_group_set_back(tmp_path):
    from transformers import AutoModelForCausalLM

    model = tiny_llama()
    model.save_pretrained(tmp_path / "reference")
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    moved = ["model.layers.1.mlp.down_proj.weight", "model.layers.1.self_attn.q_proj.weight", "model.norm.weight"]
    with torch.no_grad():
        for name in moved:
            model.state_dict()[name].add_(0.5)
    model.save_pretrained(tmp_path / "policy")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(STORIES260K / name, tmp_path / "policy" / name)
    base = [{"prompt_index": 0, "judge": 0.0}]

    def evaluate(folder: str) -> dict:  # "KL": the hybrid's tensors that differ from the reference
        state = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
        differ = sum(not torch.equal(state[k], reference[k]) for k in reference)
        metrics = {"kl_mean": float(differ), "judge_mean": 0.1 * differ, "ended_fraction": 0.0, "distinct_2": 1.0}
        return {"metrics": metrics, "samples": [{"prompt_index": 0, "judge": 0.1 * differ}]}

    out = measure_hybrids(str(tmp_path / "policy"), str(tmp_path / "reference"), None, evaluate, base)
    groups = out["groups"]
    assert out["changed_tensors"] == 3
    # measured: the policy itself, and only the groups holding a moved tensor (block 0 holds none)
    assert set(groups) == {"nothing", "block 1", "attention", "mlp", "outside the blocks"}
    assert {g: r["kl"] for g, r in groups.items()} == {
        "nothing": 3.0, "block 1": 1.0, "attention": 2.0, "mlp": 2.0, "outside the blocks": 2.0,
    }  # fmt: skip
    assert groups["block 1"]["reverted_tensors"] == 2 and groups["nothing"]["reverted_tensors"] == 0
    assert groups["mlp"]["judge_gain"]["mean"] == pytest.approx(0.2)
    norm = reference["model.norm.weight"]  # ones: |0.5 * 1| / |1| per element
    assert groups["outside the blocks"]["relative_change"] == pytest.approx(
        0.5 * norm.numel() ** 0.5 / norm.norm().item()
    )
    assert math.isclose(groups["nothing"]["relative_change"], 0.0)
    only = measure_hybrids(str(tmp_path / "policy"), str(tmp_path / "reference"), ["mlp"], evaluate, base)
    assert set(only["groups"]) == {"mlp"}

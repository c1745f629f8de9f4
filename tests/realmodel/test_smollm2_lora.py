"""LoRA on SmolLM2, whose LM head is its input embedding (tied): the merged export is the trained model, tied
unless an adapter sits on the embedding or the head (then the trained model computes the two apart).

The export is the stages' own path (``export_parts`` then ``save_pretrained_atomically``, as
``export_at_fit_end`` calls them on one device), reloaded the way a user loads it: plain
``AutoModelForCausalLM.from_pretrained``.
"""

from __future__ import annotations

import pytest
import torch
from float32_bounds import output_bound
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from rlhf_lit.models import load_causal_lm
from rlhf_lit.models.lora import LoRAConfig, export_parts, peft_model_of, with_lora
from rlhf_lit.stages.export import save_pretrained_atomically
from rlhf_lit.tokenizer import load_tokenizer

# Not slow: one 135M model, a merge, a 0.5 GB write and a reload: a few seconds.
pytestmark = pytest.mark.realmodel


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    return load_tokenizer(str(smollm2_path))


def lora_policy(path, tokenizer, targets=None):
    """SmolLM2 with LoRA adapters whose B matrices are moved off 0 (as training would), so merging
    them changes every adapted weight: a merge left out, or landing on the wrong copy, shows."""
    torch.manual_seed(0)
    model = with_lora(
        load_causal_lm(str(path), tokenizer), LoRAConfig(r=4, alpha=8, target_modules=targets), "causal_lm"
    )
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02)
    return model.eval()


def test_a_merged_export_reloads_tied_and_gives_the_lora_models_logits(smollm2_path, tokenizer, tmp_path):
    model = lora_policy(smollm2_path, tokenizer)
    ids = torch.tensor([tokenizer("<|im_start|>user\nHi there, who are you?<|im_end|>\n")["input_ids"]])
    with torch.no_grad():
        live = model(input_ids=ids).logits  # (1, T, V): base weights plus the adapters, computed apart
    written, weights = export_parts(model, None)
    path = save_pretrained_atomically(written, tokenizer, tmp_path / "sft", "SFT model", state_dict=weights)
    assert (
        peft_model_of(model) is not None and model.lm_head.weight is model.get_input_embeddings().weight
    )  # live: unmerged

    reloaded = AutoModelForCausalLM.from_pretrained(path).eval()
    assert reloaded.config.tie_word_embeddings
    assert reloaded.lm_head.weight is reloaded.get_input_embeddings().weight  # one tensor, not two equal copies
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in set(f.keys())  # written once, as the embedding
    with torch.no_grad():
        merged = reloaded(input_ids=ids).logits
    # x W + s (x A) B against x (W + s B A): the same sums in another order and grouping (float32_bounds),
    # the merged weight's own rounding (eps * |W| per entry) included in the per-reduction eps.
    bound = output_bound(reloaded.config, float(live.abs().max()), ids.shape[1])
    torch.testing.assert_close(merged, live, rtol=0, atol=bound)
    # The adapters moved the logits far past the bound, so an export without them could not pass.
    with torch.no_grad(), peft_model_of(model).disable_adapter():
        base = model(input_ids=ids).logits
    assert float((base - live).abs().max()) > 10 * bound


@pytest.mark.parametrize("target", ["embed_tokens", "lm_head"])
def test_an_adapter_on_the_shared_embedding_is_exported_untied_as_the_model_trained(
    smollm2_path, tokenizer, tmp_path, target
):
    # peft adapts the named module only, not its tied twin: the trained model computes the two apart.
    # A merge into the one shared weight would move both (0.26 of a logit apart with adapters this
    # small, measured before the export untied them); the export must hold two weights.
    model = lora_policy(smollm2_path, tokenizer, targets=[target, "q_proj"])
    for name, param in model.named_parameters():
        if "lora_embedding" in name:  # peft starts an embedding's A at 0 (not its B): move both
            torch.nn.init.normal_(param, std=0.02)
    ids = torch.tensor([tokenizer("<|im_start|>user\nHi there, who are you?<|im_end|>\n")["input_ids"]])
    with torch.no_grad():
        live = model(input_ids=ids).logits
    written, weights = export_parts(model, None)
    path = save_pretrained_atomically(written, tokenizer, tmp_path / "sft", "SFT model", state_dict=weights)
    reloaded = AutoModelForCausalLM.from_pretrained(path).eval()
    assert not reloaded.config.tie_word_embeddings
    assert reloaded.lm_head.weight is not reloaded.get_input_embeddings().weight
    assert model.lm_head.weight is model.get_input_embeddings().weight  # the live model: still one weight
    with torch.no_grad():
        merged = reloaded(input_ids=ids).logits
        with peft_model_of(model).disable_adapter():
            base = model(input_ids=ids).logits
    bound = output_bound(reloaded.config, float(live.abs().max()), ids.shape[1])
    torch.testing.assert_close(merged, live, rtol=0, atol=bound)
    assert float((base - live).abs().max()) > 10 * bound

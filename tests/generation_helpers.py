"""Helpers of the generation tests (tests/models, and the PPO tests through ppo_helpers): stories260K, its
EOS and pad ids, prompts of different lengths, a left-padded prompt batch and an EOS-biased policy; and
a model cut to fewer layers (tests/conftest.py's ``two_layer_stories``, for the compiled tests, and
tests/realmodel's ``smollm2_two_layers``)."""

from __future__ import annotations

from pathlib import Path

import assets_paths
import pytest
import torch
from transformers import AutoModelForCausalLM

from rlhf_lit.tokenizer import load_tokenizer

STORIES = str(assets_paths.STORIES260K)
EOS, PAD = 2, 0  # stories260K: eos 2, pad = <unk> 0


def truncated_model(source: str | Path, folder: Path, layers: int, leave_out: tuple[str, ...] = ()) -> str:
    """A copy of the causal LM in ``source`` in ``folder`` with only its first ``layers`` decoder
    layers, and every other file of ``source`` but those named in ``leave_out`` (tokenizer, chat
    template, generation config). Its architecture, vocabulary, tokenizer and embeddings (tied or
    not, as ``save_pretrained`` writes them) are the source's; its outputs are not, so it stands in
    only where a test asserts no more than how the model is run. Returns its path."""
    model = AutoModelForCausalLM.from_pretrained(source)
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    model.save_pretrained(folder)
    for item in Path(source).iterdir():  # the generation config as the source has it, over the one written
        if item.name not in ("config.json", "model.safetensors", *leave_out):
            (folder / item.name).write_bytes(item.read_bytes())
    return str(folder)


def truncated_stories(folder: Path, layers: int) -> str:
    """A copy of stories260K in ``folder`` with only its first ``layers`` decoder layers
    (:func:`truncated_model`), for tests whose cost is compiling it. TorchInductor's lowering takes
    time in proportion to the graph's nodes (most of them the decoder layers'), while a layer's
    kernels are the same C++ as the next layer's and compile once; on an empty compile cache one
    compiled-pass test on 2 layers cost 114 s of CPU against 160 s on 5. Returns its path."""
    return truncated_model(STORIES, folder, layers)


def prompt_batch(tokenizer, texts: list[str]) -> dict[str, torch.Tensor]:
    """A left-padded prompt batch as the prompt data module makes it."""
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "index": torch.arange(len(texts))}


class EosBias(torch.nn.Module):
    """Wraps an LM head and adds ``bias`` to the EOS logit, so EOS is sampled at varied steps."""

    def __init__(self, head: torch.nn.Module, bias: float) -> None:
        super().__init__()
        self.head, self.bias = head, bias

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.head(hidden)  # (B, T, V)
        return logits + self.bias * torch.nn.functional.one_hot(torch.tensor(EOS), logits.shape[-1])


STORY_PROMPTS = ["Once upon a time there was", "The cat", "Lily and Tom went to the park to", "A"]
"""Prompts of different lengths (left padding differs per row)."""


def eos_biased_policy(tokenizer, bias: float = 24.0, model_path: str = STORIES) -> torch.nn.Module:
    """stories260K (or the copy at ``model_path``) in eval mode with ``bias`` added to the EOS logit,
    so rows end at varied steps."""
    from rlhf_lit.models import load_causal_lm

    model = load_causal_lm(model_path, tokenizer)
    model.lm_head = EosBias(model.lm_head, bias)
    return model.eval()


@pytest.fixture(scope="module")
def tokenizer():
    """stories260K's tokenizer, padding on the left as PPO's prompts are (a fixture: the generation
    tests' conftest files import it)."""
    return load_tokenizer(STORIES, padding_side="left")


@pytest.fixture(scope="module")
def policy(tokenizer):
    """stories260K with a raised EOS logit, so sampled rows end at varied steps (a fixture, as above)."""
    return eos_biased_policy(tokenizer)

"""Fixtures for the demo tests: the shared offline assets and a tiny random GPT-2 on disk."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

ASSETS = Path(__file__).resolve().parents[3] / "shared" / "assets"
STORIES260K = ASSETS / "models" / "stories260K"
TINYSTORIES = ASSETS / "data" / "tinystories" / "val.txt"
GPT2_TOKENIZER = ASSETS / "tokenizers" / "gpt2"


@pytest.fixture(scope="session")
def stories_path() -> str:
    """The real 260K-parameter Llama (vocab 512, pad 0 = <unk>, bos 1, eos 2)."""
    assert (STORIES260K / "model.safetensors").exists(), f"missing asset {STORIES260K}"
    return str(STORIES260K)


@pytest.fixture(scope="session")
def tinystories() -> str:
    """TinyStories validation paragraphs, blank-line separated (4,302 paragraphs)."""
    assert TINYSTORIES.exists(), f"missing asset {TINYSTORIES}"
    return str(TINYSTORIES)


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory) -> str:
    """A tiny random GPT-2 LM with the real GPT-2 tokenizer files (no pad token: one is added)."""
    path = tmp_path_factory.mktemp("tiny-gpt2")
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=128, vocab_size=50257)
    GPT2LMHeadModel(config).save_pretrained(path)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(GPT2_TOKENIZER / name, path / name)
    return str(path)

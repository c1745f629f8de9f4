"""Fixtures for the data tests: the real tokenizers from the shipped assets (no network)."""

import shutil

import pytest
from assets_paths import STORIES260K_CHAT
from data_assets import GPT2_TOKENIZER, STORIES260K
from transformers import AutoTokenizer, GPT2TokenizerFast


@pytest.fixture(scope="session")
def stories_tok():
    """Llama-style sentencepiece tokenizer: pad <unk>=0, bos <s>=1 (added in front), eos </s>=2."""
    return AutoTokenizer.from_pretrained(str(STORIES260K))


@pytest.fixture(scope="session")
def gpt2_tok(tmp_path_factory):
    """GPT-2 byte-level BPE: no BOS added, eos 50256, no pad token (tests set one on a copy)."""
    d = tmp_path_factory.mktemp("gpt2")
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(GPT2_TOKENIZER / name, d / name)
    return GPT2TokenizerFast.from_pretrained(str(d))


@pytest.fixture(scope="module")
def chat_tok():
    """stories260K with a chat template (assets/README.md): ``<s>``, ``User: ...\n``, ``Assistant: ...</s>\n``."""
    return AutoTokenizer.from_pretrained(str(STORIES260K_CHAT))

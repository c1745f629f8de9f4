"""Fixtures of the command tests: the fake reward-model exports of ``rlhf-lit iterate``'s loop (test_iterate.py,
test_iterate_prompts.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from assets_paths import STORIES260K, STORIES260K_CHAT


def reward_model_of(policy: Path, path: Path) -> Path:
    """A reward model (random head) from ``policy`` with its tokenizer, written to ``path``."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_pretrained(str(policy), num_labels=1).save_pretrained(path)
    AutoTokenizer.from_pretrained(str(policy)).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_rm(tmp_path_factory) -> Path:
    """A stories260K reward model (random head) with the policy's tokenizer: the fake reward-model export."""
    return reward_model_of(STORIES260K, tmp_path_factory.mktemp("rm"))


@pytest.fixture(scope="session")
def chat_rm(tmp_path_factory) -> Path:
    """The same from stories260K-chat, with its chat template: the fake reward-model export of a chat policy."""
    return reward_model_of(STORIES260K_CHAT, tmp_path_factory.mktemp("chat-rm"))

"""Reward models on disk for the command-line tests (the SFT model is stories260K itself), and the prompt ids
the evaluation library hands to `generate` (`fed`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))  # cli_helpers

from cli_helpers import STORIES, rlhf_lit_forked, two_process_ppo  # noqa: E402

import rlhf_lit.models.generation as generation  # noqa: E402


def _reward_model(path: Path, base: str, head: float | None) -> str:
    torch.manual_seed(0)
    rm = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1)
    if head is not None:
        torch.nn.init.constant_(rm.score.weight, head)
    rm.save_pretrained(path)
    AutoTokenizer.from_pretrained(base).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def stories_rm(tmp_path_factory) -> str:
    """A stories260K reward model with a random head and the policy's tokenizer."""
    return _reward_model(tmp_path_factory.mktemp("rm"), str(STORIES), None)


@pytest.fixture(scope="session")
def nan_rm(tmp_path_factory) -> str:
    """A reward model whose every score is NaN (its head is NaN)."""
    return _reward_model(tmp_path_factory.mktemp("nan-rm"), str(STORIES), float("nan"))


@pytest.fixture(scope="session")
def gpt2_rm(gpt2_dir, tmp_path_factory) -> str:
    """A reward model with GPT-2's tokenizer (50,257 tokens): not the stories policy's 512."""
    return _reward_model(tmp_path_factory.mktemp("gpt2-rm"), gpt2_dir, None)


def _straight(tmp_path_factory, rm: str, strategy: str) -> Path:
    root = tmp_path_factory.mktemp(f"straight-{strategy}")
    done = rlhf_lit_forked("fit", "--config", str(two_process_ppo(root, rm, strategy)), cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("[rlhf-lit] exported") == 1  # rank 0 only
    return root


@pytest.fixture(scope="session")
def straight_ddp(tmp_path_factory, stories_rm) -> Path:
    """An uninterrupted ddp run of ``cli_helpers.two_process_ppo`` on one node: what a stopped and resumed run
    (tests/cli/test_preemption_cli.py) and two nodes (tests/cli/test_multinode_cli.py) must end as."""
    return _straight(tmp_path_factory, stories_rm, "ddp")


@pytest.fixture(scope="session")
def straight_fsdp2(tmp_path_factory, stories_rm) -> Path:
    """An uninterrupted fsdp2 run of ``cli_helpers.two_process_ppo`` on one node: what two nodes, and a run
    killed on one node and resumed on two, must end as (tests/cli/test_multinode_cli.py)."""
    return _straight(tmp_path_factory, stories_rm, "fsdp2")


@pytest.fixture
def fed(monkeypatch) -> list[list[int]]:
    """The prompt ids (left padding removed) of every row the library hands to ``generate``."""
    rows: list[list[int]] = []
    original = generation.generate_responses

    def spy(model, input_ids, attention_mask, *args, **kwargs):
        rows.extend(ids[mask.bool()].tolist() for ids, mask in zip(input_ids, attention_mask))
        return original(model, input_ids, attention_mask, *args, **kwargs)

    monkeypatch.setattr(generation, "generate_responses", spy)
    return rows

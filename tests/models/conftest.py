"""Fixtures of the generation tests: the left-padding stories260K tokenizer and the EOS-biased
policy (``generation_helpers.eos_biased_policy``), one of each per test module (as tests/ppo's)."""

import pytest
from generation_helpers import eos_biased_policy

from rlhf_lit.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    """stories260K's tokenizer, padding on the left as PPO's prompts are."""
    from generation_helpers import STORIES

    return load_tokenizer(STORIES, padding_side="left")


@pytest.fixture(scope="module")
def policy(tokenizer):
    """stories260K with a raised EOS logit, so sampled rows end at varied steps."""
    return eos_biased_policy(tokenizer)

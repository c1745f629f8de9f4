"""Fixtures shared by the PPO generation tests: the left-padding stories260K tokenizer and the
EOS-biased policy, one of each per test module (defined in tests/generation_helpers.py, shared with tests/models)."""

from generation_helpers import policy, tokenizer  # noqa: F401  (pytest fixtures)

"""An exported RM whose normalisation bias could not be folded (Llama) is scored with it by PPO."""

from __future__ import annotations

import torch
from ppo_helpers import STORIES, prompt_batch, tiny_module

from rlhf_lit.models import load_reward_model, sequence_scores
from rlhf_lit.models.reward_norm import REWARD_BIAS_KEY


def test_ppo_score_adds_the_unfolded_reward_bias(tmp_path):
    # An "exported" Llama RM: random head, and a bias stored in its config as RewardModelModule writes
    # it when no weight can carry it.
    torch.manual_seed(0)
    rm = load_reward_model(STORIES)
    setattr(rm.config, REWARD_BIAS_KEY, 0.75)
    rm.save_pretrained(tmp_path / "rm")
    module = tiny_module(reward_model=str(tmp_path / "rm"))
    batch = prompt_batch(module.tokenizer, ["Once upon a time", "Tom had a red ball"])
    raw = sequence_scores(module.reward_model, batch["input_ids"], batch["attention_mask"])  # (B,)
    scores = module.score(batch["input_ids"], batch["attention_mask"])  # (B,)
    # score = raw logit + 0.75 for every row (the offset is added, not subtracted).
    torch.testing.assert_close(scores, raw + 0.75)
    # Without the key the score is the raw logit.
    module_plain = tiny_module(reward_model=STORIES)
    raw_plain = sequence_scores(module_plain.reward_model, batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(module_plain.score(batch["input_ids"], batch["attention_mask"]), raw_plain)

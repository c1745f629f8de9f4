"""objective/scores_std and objective/replaced_fraction: how much of the reward model's signal reaches PPO."""

from __future__ import annotations

import torch
from ppo_helpers import TINYSTORIES, tiny_module, tiny_trainer

from rlhf_lit.data import PromptDataModule
from rlhf_lit.stages.ppo.config import RewardConfig


def _fit(tmp_path, reward):
    module = tiny_module(max_rollouts=2, reward=reward)
    data = PromptDataModule(
        tokenizer=module.tokenizer, train_path=TINYSTORIES, format="paragraphs", max_records=8, batch_size=4, seed=3
    )
    trainer = tiny_trainer(tmp_path)
    trainer.fit(module, data)
    return trainer.logger.history


def test_the_replaced_share_is_the_unended_share_under_a_penalty_and_zero_without(tmp_path):
    penalised = _fit(tmp_path / "a", RewardConfig(missing_eos_penalty=-1.0))
    plain = _fit(tmp_path / "b", RewardConfig())
    for step, metrics in penalised.items():
        # 8 new tokens: stories260K rarely ends, so most scores are replaced
        assert metrics["objective/replaced_fraction"] == 1.0 - metrics["response/ended_fraction"], step
    assert any(m["objective/replaced_fraction"] > 0 for m in penalised.values())
    assert all(m["objective/replaced_fraction"] == 0.0 for m in plain.values())


def test_the_scores_std_is_the_population_std_of_the_raw_scores(tmp_path, monkeypatch):
    from rlhf_lit.stages.ppo import metrics as ppo_metrics

    seen = []
    original = ppo_metrics.rollout_statistics

    def spy(rollout, *args, **kwargs):
        stats = original(rollout, *args, **kwargs)
        seen.append((rollout.raw_scores.clone(), stats["objective/scores_std"]))
        return stats

    monkeypatch.setattr("rlhf_lit.stages.ppo.module.rollout_statistics", spy)
    _fit(tmp_path, RewardConfig())
    for raw, std in seen:
        mean = sum(raw.tolist()) / len(raw)
        by_hand = (sum((x - mean) ** 2 for x in raw.tolist()) / len(raw)) ** 0.5
        assert torch.isclose(std, torch.tensor(by_hand), rtol=1e-5), (std, by_hand)

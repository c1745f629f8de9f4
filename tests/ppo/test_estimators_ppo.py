"""The critic-free estimators wired into PPOModule: k samples per prompt, group advantages, no critic.

One rollout of 2 prompts x k = 3 samples on stories260K (real sampling, a random-head RM, so every
row scores differently). The expected advantages are computed here from the rollout's scores,
grouping rows by their actual prompt tokens (not by position), with plain Python arithmetic.
"""

from __future__ import annotations

import math

import pytest
import torch
from lightning.pytorch import LightningDataModule
from ppo_helpers import prompt_batch, tiny_module, tiny_trainer
from torch.utils.data import DataLoader

from rlhf_lit.models.generation import SamplingConfig
from rlhf_lit.stages.optim import OptimizerConfig
from rlhf_lit.stages.ppo_config import KLConfig, PPOConfig

PROMPTS = ["Once upon a time, there was", "Tom had a red"]
K = 3


class OnePromptBatch(LightningDataModule):
    """One left-padded prompt batch per epoch; records what PPO reports as consumed."""

    def __init__(self, batch: dict) -> None:
        super().__init__()
        self.batch, self.consumed, self.batch_size = batch, [], len(batch["input_ids"])

    def train_dataloader(self):
        return DataLoader([self.batch], batch_size=None, collate_fn=lambda b: b)

    def mark_consumed(self, n: int) -> None:
        self.consumed.append(n)


def run_one_rollout(tmp_path, **overrides):
    """Fit one rollout; returns (module, rollout, data, logged metrics, trainer)."""
    kwargs = dict(
        sampling=SamplingConfig(max_new_tokens=6, temperature=1.0, samples_per_prompt=K),
        ppo=PPOConfig(epochs=1, minibatch_size=3, estimator="grpo"),
        kl=KLConfig(kind="fixed", init_coef=0.1),
        optimizer=OptimizerConfig(lr=1e-3, eps=1e-5),
        max_rollouts=1,
    )
    kwargs.update(overrides)
    module = tiny_module(**kwargs)
    record = {}
    make_rollout = module.make_rollout

    def recording(batch, timer):
        rollout, stats = make_rollout(batch, timer)
        record["rollout"] = rollout
        return rollout, stats

    module.make_rollout = recording
    data = OnePromptBatch(prompt_batch(module.tokenizer, PROMPTS))
    trainer = tiny_trainer(tmp_path)
    trainer.fit(module, datamodule=data)
    return module, record["rollout"], data, trainer.logger.history[0], trainer


def groups_by_prompt(rollout) -> list[list[int]]:
    """Row indices grouped by the prompt tokens they start with, in order of first appearance."""
    prompts = rollout.query_responses[:, : rollout.prompt_length]
    groups: dict[tuple, list[int]] = {}
    for i, row in enumerate(prompts.tolist()):
        groups.setdefault(tuple(row), []).append(i)
    return list(groups.values())


def sequence_rewards(rollout) -> list[float]:
    """Score minus the summed KL penalty: what the group estimators score (0.1 = the fixed coef)."""
    return [float(s) - 0.1 * float(k) for s, k in zip(rollout.scores, rollout.kl.sum(1))]


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory):
    return run_one_rollout(tmp_path_factory.mktemp("grpo"))


def test_each_prompt_is_repeated_k_times_as_consecutive_rows(grpo_run):
    module, rollout, data, _, _ = grpo_run
    assert rollout.batch_size == len(PROMPTS) * K
    assert groups_by_prompt(rollout) == [[0, 1, 2], [3, 4, 5]]
    # The k samples of a prompt differ (the per-rank generator draws for every row).
    responses = rollout.response_ids.tolist()
    assert len({tuple(r) for r in responses[:3]}) > 1 and len({tuple(r) for r in responses[3:]}) > 1
    assert data.consumed == [len(PROMPTS)]  # prompts, not rows: the data position stays right


def test_grpo_advantages_are_the_group_normalised_sequence_rewards(grpo_run):
    _, rollout, _, _, _ = grpo_run
    rewards = sequence_rewards(rollout)
    assert len({round(r, 4) for r in rewards}) == 6  # not degenerate
    for group in groups_by_prompt(rollout):
        values = [rewards[i] for i in group]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))  # unbiased, as TRL
        for i in group:
            expected = (rewards[i] - mean) / (std + 1e-4)
            n = int(rollout.response_mask[i].sum())
            assert rollout.advantages[i, :n].tolist() == pytest.approx([expected] * n, rel=1e-4, abs=1e-5)
            assert (rollout.advantages[i, n:] == 0).all()
    torch.testing.assert_close(rollout.returns, rollout.advantages)


def test_critic_free_estimator_builds_no_critic_and_one_optimizer(grpo_run):
    module, rollout, _, metrics, trainer = grpo_run
    assert module.critic is None
    assert len(trainer.optimizers) == 1
    policy_params = {id(p) for p in module.policy.parameters()}
    assert {id(p) for g in trainer.optimizers[0].param_groups for p in g["params"]} == policy_params
    assert not any(k.startswith("critic.") for k in module.state_dict())
    assert "lr_critic" not in metrics and "value/explained_variance" not in metrics
    assert (rollout.old_values == 0).all()


@pytest.mark.parametrize("estimator", ["rloo", "dr_grpo", "reinforce_pp"])
def test_other_critic_free_estimators(tmp_path, estimator):
    module, rollout, _, _, trainer = run_one_rollout(tmp_path, ppo=PPOConfig(epochs=1, minibatch_size=3, estimator=estimator))
    assert module.critic is None and len(trainer.optimizers) == 1
    rewards = sequence_rewards(rollout)
    if estimator == "reinforce_pp":  # gamma 1: the return-to-go at token 0 is the whole sequence reward
        torch.testing.assert_close(rollout.returns[:, 0], torch.tensor(rewards), rtol=1e-5, atol=1e-5)
        return
    for group in groups_by_prompt(rollout):
        values = [rewards[i] for i in group]
        for j, i in enumerate(group):
            others = [v for jj, v in enumerate(values) if jj != j]
            if estimator == "rloo":
                expected = values[j] - sum(others) / len(others)
            else:
                expected = values[j] - sum(values) / len(values)
            assert float(rollout.advantages[i, 0]) == pytest.approx(expected, rel=1e-4, abs=1e-5)


def test_group_estimators_refuse_one_sample_per_prompt():
    with pytest.raises(ValueError, match="samples_per_prompt >= 2"):
        tiny_module(ppo=PPOConfig(estimator="grpo"))


def test_critic_settings_are_refused_without_a_critic():
    with pytest.raises(ValueError, match="trains no critic; leave critic_optimizer"):
        tiny_module(ppo=PPOConfig(estimator="reinforce_pp"), critic_optimizer=OptimizerConfig())


def test_rows_not_divisible_into_steps_are_refused(tmp_path):
    # 2 prompts x 3 samples = 6 rows; a step of 4 rows does not divide them.
    with pytest.raises(ValueError, match=r"6 rows per process.*samples_per_prompt 3"):
        run_one_rollout(tmp_path, ppo=PPOConfig(epochs=1, minibatch_size=4, estimator="grpo"))

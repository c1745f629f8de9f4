"""PPO with a reward-model ensemble: the source's aggregate, the member and std logs, the per-response
std on the experience, the critic from member 0, and the refusals of bad aggregate settings."""

from __future__ import annotations

import json

import pytest
import torch
from ppo_helpers import STORIES, tiny_module, tiny_trainer
from torch.testing import assert_close
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from rlhf_lit.data import PromptDataModule
from rlhf_lit.models.generation import SamplingConfig
from rlhf_lit.models.reward_ensemble import RewardEnsemble
from rlhf_lit.stages.ppo.config import KLConfig, PPOConfig, RewardConfig, RewardSource
from rlhf_lit.stages.ppo.reward_sources import RewardSources

torch.set_num_threads(1)

# Three responses scored by two members (see tests/functional/test_ensemble.py for the arithmetic):
# means 2, 2, 2; population stds 1, 0, 3; minima 1, 2, -1.
MEMBER_SCORES = torch.tensor([[1.0, 3.0], [2.0, 2.0], [-1.0, 5.0]])


def test_the_reward_model_source_aggregates_member_scores_and_logs_each_member_and_the_std():
    sources = RewardSources([RewardSource(name="rm", weight=2.0, aggregate="uncertainty_weighted", lam=0.5)])
    total, parts = sources(MEMBER_SCORES, None)
    assert_close(parts["reward/rm"], torch.tensor([1.5, 2.0, 0.5]))  # 2 - 0.5 * std
    assert_close(total, torch.tensor([3.0, 4.0, 1.0]))  # weight 2
    assert_close(parts["reward/rm/member_0"], torch.tensor([1.0, 2.0, -1.0]))
    assert_close(parts["reward/rm/member_1"], torch.tensor([3.0, 2.0, 5.0]))
    assert_close(parts["reward/rm/std"], torch.tensor([1.0, 0.0, 3.0]))
    total, _ = RewardSources([RewardSource(name="rm", aggregate="worst_case")])(MEMBER_SCORES, None)
    assert_close(total, torch.tensor([1.0, 2.0, -1.0]))
    total, parts = RewardSources([RewardSource(name="rm")])(MEMBER_SCORES, None)  # the default: mean
    assert_close(total, torch.tensor([2.0, 2.0, 2.0]))


def test_a_single_reward_model_keeps_its_scores_and_logs_no_members():
    scores = torch.tensor([0.25, -1.5])
    total, parts = RewardSources([RewardSource(name="rm")])(scores, None)
    assert torch.equal(total, scores) and set(parts) == {"reward/rm"}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"aggregate": "median"},
            "reward source 'rm': aggregate must be one of mean, uncertainty_weighted, worst_case; got 'median'",
        ),
        ({"aggregate": "uncertainty_weighted"}, "aggregate uncertainty_weighted needs lam"),
        ({"aggregate": "uncertainty_weighted", "lam": -0.5}, "lam must be >= 0, got -0.5"),
        ({"aggregate": "worst_case", "lam": 0.5}, "lam applies to aggregate uncertainty_weighted only"),
        (
            {"function": "ppo_helpers:answer_reward", "aggregate": "worst_case"},
            "is a reward function; aggregate and lam apply",
        ),
        ({"function": "ppo_helpers:answer_reward", "lam": 1.0}, "is a reward function; aggregate and lam apply"),
    ],
)
def test_bad_aggregate_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RewardSource(name="rm", **kwargs)


def test_an_aggregate_other_than_mean_needs_an_ensemble():
    reward = RewardConfig(sources=[RewardSource(name="rm", aggregate="worst_case")])
    with pytest.raises(
        ValueError,
        match="aggregate worst_case needs a reward-model ensemble; model.reward_model .* is a single reward model",
    ):
        tiny_module(reward=reward)


@pytest.fixture(scope="module")
def ensemble_dir(tmp_path_factory):
    """Two stories260K reward models with different random heads, exported as an ensemble."""
    path = tmp_path_factory.mktemp("ensemble")
    members = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        members.append(AutoModelForSequenceClassification.from_pretrained(STORIES, num_labels=1))
    RewardEnsemble(members, seeds=[0, 1]).save_pretrained(path)
    AutoTokenizer.from_pretrained(STORIES).save_pretrained(path)
    return path


def test_ppo_with_an_ensemble_logs_members_and_std_and_keeps_the_per_response_std(tmp_path, ensemble_dir):
    reward = RewardConfig(sources=[RewardSource(name="rm", aggregate="uncertainty_weighted", lam=0.5)])
    module = tiny_module(
        reward_model=str(ensemble_dir),
        reward=reward,
        max_rollouts=1,
        sampling=SamplingConfig(max_new_tokens=6),
        ppo=PPOConfig(epochs=1, minibatch_size=2),
        kl=KLConfig(kind="fixed", init_coef=0.1),
    )
    assert isinstance(module.reward_model, RewardEnsemble) and module.reward_model.size == 2
    # The separate critic starts from member 0 (value_model unset).
    assert torch.equal(module.critic.model.score.weight, module.reward_model.members[0].score.weight)
    experiences = []
    make_rollout = module.make_rollout

    def recording(batch, timer, *args):
        out = make_rollout(batch, timer, *args)
        experiences.append(out)
        return out

    module.make_rollout = recording
    prompts = ["Once upon a time there was", "Tom had a red", "The little cat", "A big dog ran"]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    data = PromptDataModule(tokenizer=module.tokenizer, train_path=str(tmp_path / "p.jsonl"), batch_size=4, seed=1)
    trainer = tiny_trainer(tmp_path)
    trainer.fit(module, data)
    metrics = trainer.logger.history[0]
    rollout, experience = experiences[0]
    assert experience.reward_std is not None and experience.reward_std.shape == (4,)
    assert metrics["reward/rm/std"] == pytest.approx(float(experience.reward_std.mean()), rel=1e-5)
    assert float(experience.reward_std.min()) > 0  # two different heads disagree
    # The aggregate is linear in the member means and the std: mean - 0.5 * std, averaged over the rollout.
    members = (metrics["reward/rm/member_0"] + metrics["reward/rm/member_1"]) / 2
    assert metrics["reward/rm"] == pytest.approx(members - 0.5 * metrics["reward/rm/std"], rel=1e-5, abs=1e-6)
    assert_close(rollout.raw_scores.mean(), torch.tensor(metrics["reward/rm"]), rtol=1e-5, atol=1e-6)


def test_an_ensemble_reward_model_is_refused_under_fsdp(ensemble_dir):
    module = tiny_module(reward_model=str(ensemble_dir), max_rollouts=1)
    module._device_mesh = object()  # what the fsdp / fsdp2 strategy gives the module
    with pytest.raises(ValueError, match="a reward-model ensemble .* is not supported under fsdp / fsdp2"):
        module.configure_model()

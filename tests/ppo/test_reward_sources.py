"""Reward sources wired into PPOModule: reward functions, weights, extra columns, one placement path.

Reward functions live in ``ppo_helpers`` (importable by spec). The placement check recomputes the
per-token rewards from the rollout's own KL: ``rewards + beta * kl`` must be the shaped score on the
last response token and 0 elsewhere, for RM and function sources alike.
"""

from __future__ import annotations

import json

import pytest
import torch
from ppo_helpers import SEEN_REWARD_BATCHES, STORIES, tiny_module, tiny_trainer

from rlhf_lit.data import PromptDataModule
from rlhf_lit.models.generation import SamplingConfig
from rlhf_lit.stages.ppo.config import KLConfig, PPOConfig, RewardConfig, RewardSource

BETA = 0.1
ANSWERS = {
    "Once upon a time there was": "1.5",
    "Tom had a red": "-2.0",
    "The little cat": "0.25",
    "A big dog ran": "3.0",
}


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in ANSWERS.items()))
    return str(path)


def fit(tmp_path, prompts_file, sources, k=2, max_rollouts=1, **overrides):
    kwargs = dict(
        reward_model=None,
        value_model=STORIES,
        sampling=SamplingConfig(max_new_tokens=6, samples_per_prompt=k),
        ppo=PPOConfig(epochs=1, minibatch_size=2),
        reward=RewardConfig(sources=sources),
        kl=KLConfig(kind="fixed", init_coef=BETA),
        max_rollouts=max_rollouts,
    )
    kwargs.update(overrides)
    module = tiny_module(**kwargs)
    record = []
    make_rollout = module.make_rollout

    def recording(batch, timer, *args):
        out = make_rollout(batch, timer, *args)
        record.append(out[0])
        return out

    module.make_rollout = recording
    data = PromptDataModule(
        tokenizer=module.tokenizer, train_path=prompts_file, batch_size=2, seed=3, extra_fields=["answer"]
    )
    trainer = tiny_trainer(tmp_path)
    trainer.fit(module, data)
    return module, record, trainer.logger.history


def test_a_function_source_reads_the_extra_column_of_each_row_after_repetition(tmp_path, prompts_file):
    SEEN_REWARD_BATCHES.clear()
    sources = [RewardSource(name="answer", function="ppo_helpers:answer_reward", kwargs={"scale": 2.0})]
    module, rollouts, history = fit(tmp_path, prompts_file, sources, k=2, max_rollouts=2)
    assert "reward_model" not in module._modules  # no source uses it: not loaded
    for batch, rollout in zip(SEEN_REWARD_BATCHES, rollouts):
        assert len(batch) == 4  # 2 prompts x k = 2
        assert batch.prompts[0] == batch.prompts[1] and batch.prompts[2] == batch.prompts[3]
        assert batch.extras["answer"] == [ANSWERS[p] for p in batch.prompts]  # each row its own prompt's value
        expected = torch.tensor([2.0 * float(ANSWERS[p]) for p in batch.prompts])
        assert torch.equal(rollout.raw_scores, expected)
        ids = [rollout.response_ids[i][rollout.response_mask[i]].tolist() for i in range(4)]
        assert batch.response_ids == ids and batch.ended == rollout.ended.tolist()
    assert history[0]["reward/answer"] == pytest.approx(float(rollouts[0].raw_scores.mean()))


def test_function_scores_take_the_same_placement_path_as_the_reward_model(tmp_path, prompts_file):
    sources = [RewardSource(name="answer", function="ppo_helpers:answer_reward")]
    _, (rollout,), _ = fit(
        tmp_path, prompts_file, sources, reward=RewardConfig(sources=sources, bias=0.5, missing_eos_penalty=-3.0)
    )
    mask = rollout.response_mask
    scores = torch.where(rollout.ended, rollout.raw_scores - 0.5, torch.tensor(-3.0))
    torch.testing.assert_close(rollout.scores, scores)
    placed = torch.zeros_like(rollout.rewards)
    placed[torch.arange(4), mask.sum(1) - 1] = scores  # the last response token (EOS when it ended)
    torch.testing.assert_close(rollout.rewards + BETA * rollout.kl, placed, rtol=1e-6, atol=1e-6)


def test_weighted_sources_sum_and_each_part_is_logged(tmp_path, prompts_file):
    sources = [
        RewardSource(name="rm", weight=0.5),
        RewardSource(name="answer", weight=2.0, function="ppo_helpers:answer_reward"),
        RewardSource(name="shape", weight=-1.0, function="ppo_helpers:two_part_reward"),
    ]
    module, (rollout,), history = fit(tmp_path, prompts_file, sources, reward_model=STORIES, value_model=None)
    metrics = history[0]
    for key in ("reward/rm", "reward/answer", "reward/shape", "reward/shape/length", "reward/shape/one"):
        assert key in metrics, key
    assert metrics["reward/shape/one"] == 1.0
    assert metrics["reward/shape"] == pytest.approx(metrics["reward/shape/length"] + 1.0)
    lengths = rollout.response_mask.sum(1).float()
    assert metrics["reward/shape/length"] == pytest.approx(float(lengths.mean()))
    total = 0.5 * metrics["reward/rm"] + 2.0 * metrics["reward/answer"] - metrics["reward/shape"]
    assert metrics["objective/scores"] == pytest.approx(total, rel=1e-5, abs=1e-5)


def test_a_bad_return_value_stops_fit_naming_the_function(tmp_path, prompts_file):
    sources = [RewardSource(name="broken", function="ppo_helpers:bad_reward")]
    with pytest.raises(ValueError, match="reward function 'broken' returned 3 values for 4 responses"):
        fit(tmp_path, prompts_file, sources)


def test_sources_are_checked_when_the_module_is_built():
    with pytest.raises(ValueError, match="set model.reward_model"):
        tiny_module(reward_model=None, value_model=STORIES)
    with pytest.raises(ValueError, match="names must be unique"):
        RewardConfig(
            sources=[
                RewardSource(name="a", function="ppo_helpers:bad_reward"),
                RewardSource(name="a", function="ppo_helpers:bad_reward"),
            ]
        )
    with pytest.raises(ValueError, match="no_such"):
        tiny_module(reward=RewardConfig(sources=[RewardSource(name="x", function="ppo_helpers:no_such")]))


def one_rollout_with_early_stops(tmp_path, prompts_file, reward, **overrides):
    """The first rollout of one PPO step whose rows may also end at ".", so that one batch of 4 prompts x 2
    samples holds rows that ended with EOS and rows cut at the 8-token limit."""
    kwargs = dict(
        reward_model=None,
        value_model=STORIES,
        sampling=SamplingConfig(max_new_tokens=8, samples_per_prompt=2),
        ppo=PPOConfig(epochs=1, minibatch_size=2),
        reward=reward,
        kl=KLConfig(kind="fixed", init_coef=BETA),
        max_rollouts=1,
    )
    module = tiny_module(**{**kwargs, **overrides})
    module.stop_ids = (*module.stop_ids, module.tokenizer.convert_tokens_to_ids("."))  # some rows end early
    rollouts = []
    make_rollout = module.make_rollout
    module.make_rollout = lambda batch, timer, *args: rollouts.append(make_rollout(batch, timer, *args)) or rollouts[-1]
    data = PromptDataModule(
        tokenizer=module.tokenizer, train_path=prompts_file, batch_size=4, seed=3, extra_fields=["answer"]
    )
    tiny_trainer(tmp_path).fit(module, data)
    rollout = rollouts[0][0]
    assert rollout.ended.any() and (~rollout.ended).any()  # both kinds of row are in the batch
    return rollout


@pytest.mark.parametrize("source", ["reward_model", "function"])
def test_reward_model_and_function_scores_are_placed_alike_on_eos_and_truncated_rows(tmp_path, prompts_file, source):
    """The same bias, missing-EOS penalty and last-token placement for either kind of source."""
    if source == "reward_model":
        sources, extra = [RewardSource(name="rm")], {"reward_model": STORIES, "value_model": None}
    else:
        sources, extra = [RewardSource(name="answer", function="ppo_helpers:answer_reward")], {}
    reward = RewardConfig(sources=sources, bias=0.5, missing_eos_penalty=-3.0)
    rollout = one_rollout_with_early_stops(tmp_path, prompts_file, reward, **extra)
    mask = rollout.response_mask
    scores = torch.where(rollout.ended, rollout.raw_scores - 0.5, torch.tensor(-3.0))
    torch.testing.assert_close(rollout.scores, scores)
    placed = torch.zeros_like(rollout.rewards)
    placed[torch.arange(len(scores)), mask.sum(1) - 1] = scores  # EOS itself, or the last truncated token
    torch.testing.assert_close(rollout.rewards + BETA * rollout.kl, placed, rtol=1e-6, atol=1e-6)


def test_unfinished_penalty_is_added_to_a_cut_rows_score_not_put_in_its_place(tmp_path, prompts_file):
    """``rlhf_lit.rewards.shaping:unfinished_penalty`` beside another source: a row cut at the limit keeps
    that source's score, less the penalty (``missing_eos_penalty`` would replace it); an ended row is untouched."""
    sources = [
        RewardSource(name="answer", function="ppo_helpers:answer_reward"),
        RewardSource(
            name="unfinished", function="rlhf_lit.rewards.shaping:unfinished_penalty", kwargs={"penalty": 0.75}
        ),
    ]
    SEEN_REWARD_BATCHES.clear()
    rollout = one_rollout_with_early_stops(tmp_path, prompts_file, RewardConfig(sources=sources))
    seen = SEEN_REWARD_BATCHES[0]
    answers = torch.tensor([float(ANSWERS[p]) for p in seen.prompts])
    expected = answers - 0.75 * (~rollout.ended).float()  # by hand: the answer, 0.75 less when cut
    torch.testing.assert_close(rollout.raw_scores, expected)

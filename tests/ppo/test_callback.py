"""The online-generation callback: a text table every N rollouts, its own RNG, an optional judge."""

from __future__ import annotations

import pytest
from lightning.pytorch.loggers import TensorBoardLogger
from ppo_helpers import prompt_batch, tiny_module, tiny_trainer
from torch.utils.data import DataLoader

import rlhf_lit.callbacks
from rlhf_lit.callbacks import OnlineGeneration
from rlhf_lit.callbacks.online_generation import markdown_table
from rlhf_lit.evaluation import load_judge
from rlhf_lit.stages.ppo import RewardConfig

PROMPTS = ["Once upon a time", "The", "Tom had a red", "A big dog"]


def _loader(module):
    return DataLoader([prompt_batch(module.tokenizer, PROMPTS)] * 4, batch_size=None)


def test_table_every_n_rollouts_with_judge_and_training_unchanged(tmp_path):
    plain = tiny_module(max_rollouts=4)
    trainer = tiny_trainer(tmp_path / "plain")
    trainer.fit(plain, _loader(plain))
    reference = trainer.logger.history

    module = tiny_module(max_rollouts=4)
    callback = OnlineGeneration(["Once upon a time", "The dog"], every_n_rollouts=2, judge="ppo_helpers:length_judge")
    calls = []
    original = callback.sample
    callback.sample = lambda pl_module: calls.append(pl_module.rollout_index) or original(pl_module)
    trainer = tiny_trainer(tmp_path / "cb", callbacks=[callback])
    trainer.fit(module, _loader(module))
    assert calls == [2, 4]
    lines = callback.last_table.splitlines()
    assert lines[0] == "| prompt | response | score | judge |" and len(lines) == 4
    assert lines[2].startswith("| Once upon a time | ")
    assert trainer.logger.history[3]["samples/judge_mean"] > 0
    # The callback samples from its own seed: training metrics are identical with and without it.
    for step in range(4):
        for name, value in reference[step].items():
            if not name.startswith("time/"):
                assert trainer.logger.history[step][name] == value, (step, name)


def test_callback_writes_text_to_tensorboard(tmp_path):
    module = tiny_module(max_rollouts=1)
    callback = OnlineGeneration(["Once upon a time"], every_n_rollouts=1)
    trainer = tiny_trainer(tmp_path, callbacks=[callback], logger=TensorBoardLogger(tmp_path, name="tb"))
    trainer.fit(module, _loader(module))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb" / "version_0"), size_guidance={"tensors": 0}).Reload()
    assert "samples/text_summary" in events.Tags()["tensors"]
    assert "objective/kl" in events.Tags()["scalars"]
    assert [e.step for e in events.Scalars("objective/kl")] == [0]


def test_markdown_table_escapes_pipes_and_newlines():
    table = markdown_table(["a|b"], ["x\ny"], {"score": [1.0]})
    assert table.splitlines()[2] == "| a\\|b | x<br>y | 1.0000 |"


def test_callback_uses_the_project_judge_loader():
    # One judge loader in the project: the callback's name is the evaluation package's function.
    assert rlhf_lit.callbacks.load_judge is load_judge
    assert load_judge("ppo_helpers:length_judge")(["abc"]) == [3.0]
    with pytest.raises(ValueError, match="module:function"):
        OnlineGeneration(["x"], judge="ppo_helpers.length_judge")


@pytest.mark.parametrize("unfinished", ["as_sampled", "with_eos"])
def test_the_held_out_score_reads_responses_as_the_reward_does(unfinished):
    """The logged score is the proxy PPO optimises: with reward.unfinished=with_eos a cut response is
    scored with EOS appended after its last token, as sampled otherwise."""
    module = tiny_module(reward=RewardConfig(unfinished=unfinished))
    callback = OnlineGeneration(PROMPTS, every_n_rollouts=1)
    generated, scored = [], []
    rows_of, score = module.reward_model_inputs, module.score
    module.reward_model_inputs = lambda gen: generated.append(gen) or rows_of(gen)
    module.score = lambda ids, mask: scored.append((ids, mask)) or score(ids, mask)
    _, columns = callback.sample(module)
    (gen,), ((ids, mask),) = generated, scored
    eos = module.tokenizer.eos_token_id
    assert not gen.ended.all()  # 8 new tokens: some responses are cut (the case under test)
    for row in range(len(PROMPTS)):
        sampled = gen.query_responses[row][gen.attention_mask[row].bool()].tolist()
        read = ids[row][mask[row].bool()].tolist()
        cut = not gen.ended[row]
        assert read == (sampled + [eos] if unfinished == "with_eos" and cut else sampled), row
    assert columns["score"] == pytest.approx(score(ids, mask).tolist(), rel=1e-6)

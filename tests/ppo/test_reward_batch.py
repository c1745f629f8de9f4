"""What a reward function receives in PPO, checked by hand on a left-padded batch.

Three rows with prompts of different lengths (left-padded to 5 columns) and responses of 4 columns:
one that ends with EOS in its last column, one cut at the length limit (no EOS), and one that ends
early (pad after its EOS). Every expected id and text below is written out by hand from the
stories260K vocabulary, never computed with the code under test:

    stories260K ids: <unk> = pad 0, <s> 1, </s> = EOS 2; "Once upon a time there was a cat" ->
    <s> | ▁Once 403 ▁upon 407 ▁a 261 ▁time 378 ▁there 383 ▁was 286 ▁a 261 ▁c 280 at 294; ▁The 291

    row  prompt columns (P = 5)       response columns (R = 4)    sees
    0    1 403 407 261 378            383 286 261 2  (ended)      " there was a" + EOS
    1    0   1 291 280 294            407 261 378 383 (cut)       " upon a time there", no EOS
    2    0   0   0   1 403            378   2   0   0 (ended)     " time" + EOS, then pad

A reward function must see the response tokens only (no prompt column, no pad before the prompt
or after EOS), the EOS of an ended response among its ids but not in its text, the prompts without
padding or <s>, the EOS flags, and the data module's extra columns row for row.
"""

from __future__ import annotations

import pytest
import torch
from ppo_helpers import SEEN_REWARD_BATCHES, STORIES, tiny_module

from rlhf_lit.models.generation import Generated
from rlhf_lit.stages.ppo.config import KLConfig, RewardConfig, RewardSource
from rlhf_lit.stages.ppo.metrics import RolloutTimer
from rlhf_lit.stages.ppo.reward_sources import reward_batch
from rlhf_lit.tokenizer import load_tokenizer

PROMPT_IDS = [[1, 403, 407, 261, 378], [0, 1, 291, 280, 294], [0, 0, 0, 1, 403]]
PROMPT_MASK = [[1, 1, 1, 1, 1], [0, 1, 1, 1, 1], [0, 0, 0, 1, 1]]
RESPONSE_IDS = [[383, 286, 261, 2], [407, 261, 378, 383], [378, 2, 0, 0]]
RESPONSE_MASK = [[True] * 4, [True] * 4, [True, True, False, False]]  # up to and including the first EOS
ENDED = [True, False, True]

EXPECTED_PROMPTS = ["Once upon a time", "The cat", "Once"]
EXPECTED_RESPONSE_IDS = [[383, 286, 261, 2], [407, 261, 378, 383], [378, 2]]
EXPECTED_RESPONSES = [" there was a", " upon a time there", " time"]
ANSWERS = ["1.5", "-2.0", "0.25"]


def hand_batch() -> tuple[dict, Generated]:
    """The prompt batch (as the prompt data module yields it, with an ``answer`` extra column) and the
    rollout's :class:`Generated` of the table in the module docstring."""
    prompts, prompt_mask = torch.tensor(PROMPT_IDS), torch.tensor(PROMPT_MASK)
    responses = torch.tensor(RESPONSE_IDS)
    gen = Generated(
        query_responses=torch.cat([prompts, responses], 1),  # (3, 9)
        attention_mask=torch.cat([prompt_mask, torch.tensor(RESPONSE_MASK).long()], 1),  # (3, 9)
        response_ids=responses,  # (3, 4)
        response_mask=torch.tensor(RESPONSE_MASK),  # (3, 4)
        ended=torch.tensor(ENDED),  # (3,)
    )
    batch = {"input_ids": prompts, "attention_mask": prompt_mask, "extras": {"answer": list(ANSWERS)}}
    return batch, gen


def test_the_hand_batch_decodes_as_the_table_says():
    # The table's ids against the tokenizer, so the expectations below rest on checked ids.
    tokenizer = load_tokenizer(STORIES, padding_side="left")
    assert tokenizer("Once upon a time there was a cat").input_ids == [1, 403, 407, 261, 378, 383, 286, 261, 280, 294]
    assert tokenizer("The cat").input_ids == [1, 291, 280, 294]
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)


def test_reward_batch_holds_the_responses_only_without_prompt_or_padding():
    tokenizer = load_tokenizer(STORIES, padding_side="left")
    batch, gen = hand_batch()
    seen = reward_batch(tokenizer, batch, gen)
    assert seen.response_ids == EXPECTED_RESPONSE_IDS
    assert seen.responses == EXPECTED_RESPONSES
    assert seen.prompts == EXPECTED_PROMPTS
    assert seen.ended == ENDED
    assert seen.extras == {"answer": ANSWERS}


def test_a_reward_function_in_a_ppo_rollout_sees_exactly_the_hand_batch():
    # The real rollout path (scoring, reward sources, shaping) with sampling replaced by the hand
    # batch: the function is called once, with the table's rows, and its scores are the raw scores.
    source = RewardSource(name="answer", function="ppo_helpers:answer_reward")
    module = tiny_module(
        reward_model=None,
        value_model=STORIES,
        reward=RewardConfig(sources=[source]),
        kl=KLConfig(kind="fixed", init_coef=0.1),
    )
    batch, gen = hand_batch()
    module.generate = lambda prompts: gen
    SEEN_REWARD_BATCHES.clear()
    rollout, experience = module.make_rollout(batch, RolloutTimer(torch.device("cpu")))
    (seen,) = SEEN_REWARD_BATCHES
    assert seen.response_ids == EXPECTED_RESPONSE_IDS
    assert seen.responses == EXPECTED_RESPONSES
    assert seen.prompts == EXPECTED_PROMPTS
    assert seen.ended == ENDED
    assert seen.extras == {"answer": ANSWERS}
    assert rollout.raw_scores.tolist() == [1.5, -2.0, 0.25]
    assert experience.reward_parts["reward/answer"].item() == pytest.approx((1.5 - 2.0 + 0.25) / 3)
    # The score lands on each row's last response token (columns 3, 3 and 1 of the response):
    # rewards + beta * kl is the score there and 0 at every other position.
    placed = rollout.rewards + 0.1 * rollout.kl  # (3, 4)
    expected = torch.zeros(3, 4)
    expected[0, 3], expected[1, 3], expected[2, 1] = 1.5, -2.0, 0.25
    torch.testing.assert_close(placed * rollout.response_mask, expected)


@pytest.mark.parametrize("with_function", [True, False])
def test_a_rollout_decodes_its_responses_once(monkeypatch, with_function):
    # With a reward function the responses are decoded for it and reused by the text metrics;
    # without one they are decoded once, when the metrics ask.
    import rlhf_lit.stages.ppo.experience as experience_module
    import rlhf_lit.stages.ppo.reward_sources as sources_module

    calls = []
    for module_ in (experience_module, sources_module):
        original = module_.response_texts
        monkeypatch.setattr(
            module_, "response_texts", lambda *a, original=original, **k: calls.append(1) or original(*a, **k)
        )
    sources = [RewardSource(name="answer", function="ppo_helpers:answer_reward")] if with_function else None
    overrides = (
        {"reward_model": None, "value_model": STORIES, "reward": RewardConfig(sources=sources)} if sources else {}
    )
    module = tiny_module(kl=KLConfig(kind="fixed", init_coef=0.1), **overrides)
    batch, gen = hand_batch()
    module.generate = lambda prompts: gen
    rollout, experience = module.make_rollout(batch, RolloutTimer(torch.device("cpu")))
    assert len(calls) == (1 if with_function else 0)
    texts = module.experience_maker.texts(rollout, experience)
    again = module.experience_maker.texts(rollout, experience)
    assert len(calls) == 1 and texts is again
    assert texts == EXPECTED_RESPONSES

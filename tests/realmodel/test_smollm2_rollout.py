"""A PPO rollout on SmolLM2, whose end of turn ``<|im_end|>`` is also the pad written after it.

The policy's sampling is replaced by scripted responses (through the real masking code,
:func:`~rlhf_lit.models.generation.complete_generation`, as ``tests/ppo/test_golden_rollout.py``
does); scoring, reward shaping and GAE are the module's own, on the real model. A mask read from
``ids != pad`` would drop every end of turn; one read as "not EOS after the first" would keep the
pads. What must hold: the first ``<|im_end|>`` counts, the ones after it do not, the reward model
reads that first one, the score lands on it, and nothing off the mask carries reward or advantage.
"""

from __future__ import annotations

import pytest
import torch
from float32_bounds import EPS, output_bound

from rlhf_lit.data.encoding import TextEncoder
from rlhf_lit.models.generation import SamplingConfig, complete_generation
from rlhf_lit.stages.ppo import PPOModule
from rlhf_lit.stages.ppo.config import KLConfig, PPOConfig

# Not slow: four copies of the 135M model load in a few seconds; one scoring pass of 4 short rows.
pytestmark = pytest.mark.realmodel

END = "<|im_end|>"
R = 6
PROMPTS = ("What is the capital of France?", "What is 2 + 2?", "Name a colour.", "Say something kind to me today.")


class ScriptedPPO(PPOModule):
    """PPO whose policy 'samples' ``self.scripted`` ``(B, R)``; everything after sampling is real."""

    scripted: torch.Tensor

    def generate(self, batch):
        sequences = torch.cat([batch["input_ids"], self.scripted], dim=1)
        return complete_generation(sequences, batch["attention_mask"], self.stop_ids, self.tokenizer.pad_token_id)


@pytest.fixture(scope="module")
def rollout_case(smollm2_path):
    """A rollout of four scripted responses: the rows, their hand-written masks, the module, the rollout."""
    torch.manual_seed(0)  # the reward model's and the critic's new heads
    module = PPOModule(
        sft_model=str(smollm2_path),
        reward_model=str(smollm2_path),
        sampling=SamplingConfig(max_new_tokens=R),
        kl=KLConfig(kind="fixed", init_coef=0.1),
        ppo=PPOConfig(epochs=1, minibatch_size=4, whiten_advantages=False),  # raw GAE: comparable with a loop
    )
    module.__class__ = ScriptedPPO
    # The new value head starts at 0 (N details #4): give it weights, so GAE's values are not all 0
    # and a value read past a row's end (a pad's) would change its advantages.
    torch.nn.init.normal_(module.critic.model.score.weight, std=0.05)
    tok = module.tokenizer
    end = tok.convert_tokens_to_ids(END)
    assert tok.pad_token_id == end and tok.padding_side == "left"

    def words(text: str, n: int) -> list[int]:
        out = tok(text, add_special_tokens=False)["input_ids"][:n]
        assert len(out) == n and end not in out
        return out

    # The first <|im_end|> at positions 2, 0 and 5; the last row never ends. Every later position
    # holds <|im_end|> too (the pad), exactly as sampling writes it.
    rows = [
        words("Paris.", 2) + [end] * 4,
        [end] * R,
        words("It is four, clearly and", 5) + [end],
        words("Red is a nice warm colour", R),
    ]
    masks = [[1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0], [1] * R, [1] * R]  # by hand from the rows above
    module.scripted = torch.tensor(rows)
    prompts = TextEncoder(tok, apply_chat_template=True).encode_prompts(list(PROMPTS))
    batch = dict(tok.pad({"input_ids": prompts}, return_tensors="pt"), index=torch.arange(len(PROMPTS)))
    rollout, _ = module.make_rollout(batch, timer=None)
    return module, prompts, rows, torch.tensor(masks, dtype=torch.bool), rollout


def test_the_first_end_of_turn_counts_and_the_pads_after_it_do_not(rollout_case):
    module, _, rows, masks, rollout = rollout_case
    assert torch.equal(rollout.response_mask, masks)
    assert rollout.ended.tolist() == [True, True, True, False]
    assert torch.equal(rollout.attention_mask[:, -R:], masks.long())  # what every scoring pass attends
    assert torch.equal(rollout.response_ids, torch.tensor(rows))  # the pads are <|im_end|> ids: unchanged


def test_the_reward_model_reads_the_end_of_turn_and_the_score_lands_on_it(rollout_case):
    module, prompts, rows, masks, rollout = rollout_case
    rm = module.reward_model
    with torch.no_grad():  # each row alone, unpadded: prompt, then the response up to its first end of turn
        alone = torch.stack(
            [
                rm.score(rm.model(input_ids=torch.tensor([p + r[: int(m.sum())]])).last_hidden_state[0, -1])[0]
                for p, r, m in zip(prompts, rows, masks)
            ]
        )
    # Padded batch against rows alone: one network output in two summation orders (float32_bounds).
    bound = output_bound(rm.config, float(alone.abs().max()), rollout.query_responses.shape[1])
    torch.testing.assert_close(rollout.raw_scores, alone, rtol=0, atol=bound)
    assert torch.equal(rollout.scores, rollout.raw_scores)  # no bias, whitening, clipping or penalty configured
    last = masks.long().cumsum(1).argmax(1)  # the last counted position: 2, 0, 5, 5
    assert last.tolist() == [2, 0, 5, 5]
    placed = torch.zeros(len(rows), R)
    placed[torch.arange(len(rows)), last] = rollout.scores
    beta = module.kl_ctl.value
    assert beta == 0.1
    # rewards = -beta * KL per token, plus the score on the last counted token; the KL is 0 off the mask.
    assert torch.equal(rollout.kl[~masks], torch.zeros(int((~masks).sum())))
    torch.testing.assert_close(
        rollout.rewards, placed - beta * rollout.kl, rtol=0, atol=4 * EPS * float(placed.abs().max())
    )
    assert torch.equal(rollout.rewards[~masks], torch.zeros(int((~masks).sum())))


def test_gae_is_a_loop_over_the_counted_tokens_and_zero_off_them(rollout_case):
    module, _, _, masks, rollout = rollout_case
    gamma, lam = module.ppo.gamma, module.ppo.lam
    rewards, values = rollout.rewards.double(), rollout.old_values.double()
    expected = torch.zeros(len(masks), R, dtype=torch.float64)
    for b in range(len(masks)):
        n = int(masks[b].sum())  # the episode: the counted tokens; the state after the last one is terminal
        following = 0.0
        for t in reversed(range(n)):
            next_value = values[b, t + 1] if t + 1 < n else 0.0
            following = rewards[b, t] + gamma * next_value - values[b, t] + gamma * lam * following
            expected[b, t] = following
    # Each step adds three terms to the running sum (reward, two values): over R steps in float32 the
    # error is below 3 R eps times the largest partial magnitude, bounded by the sum of |terms|.
    magnitude = float((rewards.abs() + 2 * values.abs()).sum(1).max())
    torch.testing.assert_close(rollout.advantages.double(), expected, rtol=0, atol=3 * R * EPS * magnitude)
    assert torch.equal(rollout.advantages[~masks], torch.zeros(int((~masks).sum())))
    # Returns: the value targets, advantage + value on the counted tokens, nothing off them.
    torch.testing.assert_close(
        rollout.returns.double(), torch.where(masks, expected + values, 0.0), rtol=0, atol=3 * R * EPS * magnitude
    )
    assert torch.equal(rollout.returns[~masks], torch.zeros(int((~masks).sum())))

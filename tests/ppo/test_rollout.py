"""The rollout: reward on the last response token, masks, value positions, ratio 1 before any update."""

from __future__ import annotations

import pytest
import torch
from float32_bounds import largest_logit, logprob_bound
from ppo_helpers import EOS, PAD, prompt_batch, tiny_module, tiny_trainer
from torch.utils.data import DataLoader

from rlhf_lit.functional import POLICY_LOSSES, kl_penalty
from rlhf_lit.models import token_scores
from rlhf_lit.models.generation import complete_generation
from rlhf_lit.models.teacher_forced import forward_with_positions
from rlhf_lit.stages.ppo import PPOModule
from rlhf_lit.stages.ppo.config import KLConfig, PPOConfig, RewardConfig
from rlhf_lit.stages.ppo.metrics import RolloutTimer
from rlhf_lit.stages.ppo.rollout import minibatches

RAW_SCORES = [1.5, -2.0, 0.25, 3.0]
# Responses (R = 5) with EOS at positions 1, none, 0 and 4; junk after EOS must become pad.
RESPONSES = [[300, EOS, 301, 302, 303], [310, 311, 312, 313, 314], [EOS, 320, 321, EOS, 322], [330, 331, 332, 333, EOS]]
LAST = [1, 4, 0, 4]  # last response token (EOS included)
ENDED = [True, False, True, True]


class ScriptedPPO(PPOModule):
    """PPO whose policy 'samples' the fixed RESPONSES and whose RM returns RAW_SCORES (recording its input)."""

    def generate(self, batch):
        sequences = torch.cat([batch["input_ids"], torch.tensor(RESPONSES)], dim=1)
        return complete_generation(sequences, batch["attention_mask"], EOS, PAD)

    def score(self, query_responses, attention_mask):
        self.scored = (query_responses.clone(), attention_mask.clone())
        return torch.tensor(RAW_SCORES)


def _rollout(**overrides):
    module = tiny_module(**overrides)
    module.__class__ = ScriptedPPO
    batch = prompt_batch(module.tokenizer, ["Once upon a time", "The", "Tom had a red", "A big dog"])
    rollout, _ = module.make_rollout(batch, RolloutTimer(torch.device("cpu")))
    return module, batch, rollout


def test_reward_model_reads_query_and_response_up_to_eos():
    module, batch, rollout = _rollout()
    ids, mask = module.scored
    P = batch["input_ids"].shape[1]
    last_attended = [max(i for i, m in enumerate(row) if m) for row in mask.tolist()]
    assert last_attended == [P + t for t in LAST]
    assert ids[0, P + 2 :].tolist() == [PAD] * 3 and ids[2, P + 1 :].tolist() == [PAD] * 4
    assert rollout.ended.tolist() == ENDED
    assert rollout.response_mask.tolist() == [[t <= last for t in range(5)] for last in LAST]


def test_score_lands_on_last_response_token_without_kl():
    _, _, rollout = _rollout(kl=KLConfig(kind="fixed", init_coef=0.0))
    expected = torch.zeros(4, 5)
    for row, (last, score) in enumerate(zip(LAST, RAW_SCORES)):
        expected[row, last] = score
    assert torch.equal(rollout.rewards, expected)


def test_kl_penalty_on_every_response_token_and_missing_eos_replaces_score():
    beta = 0.1
    _, _, rollout = _rollout(
        kl=KLConfig(kind="fixed", init_coef=beta), reward=RewardConfig(bias=0.5, missing_eos_penalty=-1.0)
    )
    mask = rollout.response_mask
    kl = kl_penalty(rollout.old_logprobs, rollout.ref_logprobs, "k1")
    # Row 1 has no EOS: its score is replaced by -1; the others lose the bias 0.5.
    scores = [1.0, -1.0, -0.25, 2.5]
    assert rollout.scores.tolist() == scores
    for row in range(4):
        for t in range(5):
            want = (-beta * kl[row, t] + (scores[row] if t == LAST[row] else 0.0)) if mask[row, t] else 0.0
            assert rollout.rewards[row, t].item() == pytest.approx(float(want), abs=1e-7), (row, t)
    assert (rollout.kl[~mask] == 0).all()


def test_logprobs_and_values_are_read_at_the_predicting_position():
    module, batch, rollout = _rollout()
    P = batch["input_ids"].shape[1]
    with torch.no_grad():
        logits = forward_with_positions(module.policy, rollout.query_responses, rollout.attention_mask).logits
        logp = torch.log_softmax(logits.float() / 0.9, -1)
        values = token_scores(module.critic.model, rollout.query_responses, rollout.attention_mask)
    for row in range(4):
        for t in range(LAST[row] + 1):
            token = rollout.response_ids[row, t]
            assert rollout.old_logprobs[row, t].item() == pytest.approx(
                logp[row, P - 1 + t, token].item(), rel=2e-6, abs=1e-6
            )
            assert rollout.old_values[row, t].item() == values[row, P - 1 + t].item()
    # The reference starts equal to the policy: no KL before any update.
    torch.testing.assert_close(rollout.ref_logprobs, rollout.old_logprobs)


def test_minibatches_cover_every_row_once_in_generator_order():
    _, _, rollout = _rollout()
    order = torch.randperm(4, generator=torch.Generator().manual_seed(3)).tolist()
    seen = [mb.response_ids for mb in minibatches(rollout, 2, torch.Generator().manual_seed(3))]
    assert torch.equal(torch.cat(seen), rollout.response_ids[order])
    with pytest.raises(ValueError, match="multiple"):
        next(minibatches(rollout, 3, torch.Generator()))


@pytest.mark.parametrize("reuse_first_forward", [False, True], ids=["rescored", "first-forward-reused"])
def test_first_minibatch_has_ratio_one_and_no_clipping(tmp_path, monkeypatch, reuse_first_forward):
    calls = []
    original = POLICY_LOSSES["clipped"]

    def recording(logprobs, old_logprobs, advantages, mask, clip_range):
        loss, stats = original(logprobs, old_logprobs, advantages, mask, clip_range)
        calls.append((logprobs.detach(), old_logprobs, mask, stats))
        return loss, stats

    monkeypatch.setitem(POLICY_LOSSES, "clipped", recording)
    module = tiny_module(
        max_rollouts=1, ppo=PPOConfig(epochs=2, minibatch_size=2, reuse_first_forward=reuse_first_forward)
    )
    batch = prompt_batch(module.tokenizer, ["Once upon a time", "The", "Tom had a red", "A big dog"])
    make_rollout, rows = module.make_rollout, []

    def recording_rollout(batch, timer, *args):
        rollout, experience = make_rollout(batch, timer, *args)
        rows.append((rollout.query_responses, rollout.attention_mask))
        return rollout, experience

    module.make_rollout = recording_rollout
    tiny_trainer(tmp_path).fit(module, train_dataloaders=DataLoader([batch], batch_size=None))
    logprobs, old_logprobs, mask, stats = calls[0]
    # The rescore (all rows) and the minibatch's pass (its rows) sum in other orders: the logprob
    # bound, ~1e-5 here; a logprob one position off or of another row moves it by ~1.
    ids, attention = rows[0]
    magnitude = largest_logit(module.policy, ids, attention, module.sampling.temperature)
    bound = logprob_bound(module.policy.config, magnitude, ids.shape[1])
    torch.testing.assert_close(logprobs[mask], old_logprobs[mask], rtol=0, atol=bound)
    if reuse_first_forward:  # the old logprobs of these rows are this very forward's
        assert torch.equal(logprobs[mask], old_logprobs[mask])
    assert stats["clipfrac"].item() == 0.0
    assert stats["ratio_mean"].item() == pytest.approx(1.0, abs=bound)
    # (ratio - 1) - log ratio ~ 0.5 (log ratio)^2, plus the rounding of ratio - 1 near 1 (one eps)
    assert abs(stats["approx_kl"].item()) <= 0.5 * bound**2 + torch.finfo(torch.float32).eps
    assert len(calls) == 4  # 2 epochs x 2 minibatches
    assert (calls[-1][0][calls[-1][2]] != calls[-1][1][calls[-1][2]]).any()  # later minibatches moved


def test_batch_must_be_a_multiple_of_the_rows_per_optimizer_step(tmp_path):
    module = tiny_module(max_rollouts=1)
    batch = prompt_batch(module.tokenizer, ["Once upon a time", "The", "Tom"])
    with pytest.raises(ValueError, match="multiple"):
        tiny_trainer(tmp_path).fit(module, train_dataloaders=DataLoader([batch], batch_size=None))

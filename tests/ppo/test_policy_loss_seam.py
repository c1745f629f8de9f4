"""The policy-loss seam (rlhf_lit/functional/policy_losses.py): a variant added by the documented
steps, and nothing else, is the loss PPO's update calls, on each minibatch's own rows, and what
it logs; the choice refuses a name it does not hold."""

from __future__ import annotations

from typing import Literal, get_args

import pytest
import torch
from ppo_helpers import EOS, PAD, prompt_batch, tiny_module, tiny_trainer
from torch.utils.data import DataLoader

import rlhf_lit.functional.policy_losses as policy_losses
import rlhf_lit.stages.ppo.config as ppo_config
from rlhf_lit.functional import POLICY_LOSSES, PolicyLossKind
from rlhf_lit.models.generation import complete_generation
from rlhf_lit.stages.ppo import PPOModule
from rlhf_lit.stages.ppo.config import PPOConfig

# Responses (R = 5) ending at positions 1, never, 0 and 4: masks with positions off.
RESPONSES = [[300, EOS, 301, 302, 303], [310, 311, 312, 313, 314], [EOS, 320, 321, EOS, 322], [330, 331, 332, 333, EOS]]
TOY_STATS = {"clipfrac": 0.25, "approx_kl": 0.5, "ratio_mean": 2.0}
CLIP_RANGE = 0.3  # not value_clip_range's 0.2: the one the policy loss gets is told apart


class ScriptedPPO(PPOModule):
    """PPO whose policy 'samples' the fixed RESPONSES."""

    def generate(self, batch):
        sequences = torch.cat([batch["input_ids"], torch.tensor(RESPONSES)], dim=1)
        return complete_generation(sequences, batch["attention_mask"], EOS, PAD)


def test_the_choice_holds_the_names_of_the_mapping_and_refuses_another():
    assert set(POLICY_LOSSES) == set(get_args(PolicyLossKind))
    assert PPOConfig().policy_loss == "clipped"
    with pytest.raises(ValueError, match=r"ppo.policy_loss must be one of clipped; got 'toy'"):
        PPOConfig(policy_loss="toy")


def test_a_variant_added_by_the_documented_steps_is_what_the_update_calls(tmp_path, monkeypatch):
    calls = []

    # Step 1: a function of the one signature (REINFORCE's -A * logprob, a token mean).
    def toy(logprobs, old_logprobs, advantages, mask, clip_range):
        loss = -(advantages * logprobs)[mask].mean()  # ()
        calls.append(
            {
                "logprobs": logprobs.detach().clone(),
                "with_grad": logprobs.requires_grad,
                "old_logprobs": old_logprobs.clone(),
                "advantages": advantages.clone(),
                "mask": mask.clone(),
                "clip_range": clip_range,
                "loss": loss.item(),
            }
        )
        return loss, {name: torch.tensor(value) for name, value in TOY_STATS.items()}

    # Step 2: its name joins the choice (where PPOConfig reads it, which imported the Literal).
    extended = Literal[(*get_args(PolicyLossKind), "toy")]
    monkeypatch.setattr(policy_losses, "PolicyLossKind", extended)
    monkeypatch.setattr(ppo_config, "PolicyLossKind", extended)
    # Step 3: name -> function.
    monkeypatch.setitem(POLICY_LOSSES, "toy", toy)

    module = tiny_module(
        max_rollouts=1, ppo=PPOConfig(epochs=2, minibatch_size=2, clip_range=CLIP_RANGE, policy_loss="toy")
    )
    module.__class__ = ScriptedPPO
    with torch.no_grad():  # the policy leaves the reference: old and reference logprobs differ
        generator = torch.Generator().manual_seed(5)
        for p in module.policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    make_rollout, rollouts = module.make_rollout, []

    def recording_rollout(*args):
        rollout, experience = make_rollout(*args)
        rollouts.append(rollout)
        return rollout, experience

    module.make_rollout = recording_rollout
    batch = prompt_batch(module.tokenizer, ["Once upon a time", "The", "Tom had a red", "A big dog"])
    trainer = tiny_trainer(tmp_path)
    trainer.fit(module, train_dataloaders=DataLoader([batch], batch_size=None))

    (rollout,) = rollouts
    mask = rollout.response_mask
    assert not mask.all() and not torch.equal(rollout.old_logprobs[mask], rollout.ref_logprobs[mask])
    assert not torch.equal(rollout.advantages, rollout.returns)
    assert len(calls) == 4  # 2 epochs x 2 minibatches of 2 rows
    for epoch in range(2):
        rows = []
        for call in calls[2 * epoch : 2 * epoch + 2]:
            assert call["clip_range"] == CLIP_RANGE and call["with_grad"]
            for j in range(2):  # each row is one of the rollout's, its fields all of that row
                matches = [
                    i
                    for i in range(4)
                    if torch.equal(call["old_logprobs"][j], rollout.old_logprobs[i])
                    and torch.equal(call["advantages"][j], rollout.advantages[i])
                    and torch.equal(call["mask"][j], mask[i])
                ]
                assert len(matches) == 1, f"a row of the loss's inputs is no rollout row's: {call}"
                rows += matches
        assert sorted(rows) == [0, 1, 2, 3]  # every row once per epoch
    # Before the first optimizer step the training pass is the one that scored the rollout.
    first = calls[0]
    assert torch.equal(first["logprobs"][first["mask"]], first["old_logprobs"][first["mask"]])
    later = calls[-1]
    assert not torch.equal(later["logprobs"][later["mask"]], later["old_logprobs"][later["mask"]])
    (logged,) = trainer.logger.history.values()
    assert logged["loss/policy"] == pytest.approx(sum(c["loss"] for c in calls) / 4, rel=1e-6)
    assert logged["policy/clipfrac"] == pytest.approx(TOY_STATS["clipfrac"])
    assert logged["policy/approxkl"] == pytest.approx(TOY_STATS["approx_kl"])
    assert logged["policy/ratio"] == pytest.approx(TOY_STATS["ratio_mean"])

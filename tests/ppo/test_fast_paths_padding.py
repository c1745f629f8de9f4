"""The performance paths that reshape PPO's minibatches keep the math: the padding columns no row attends
are dropped, rows are packed, rows of like length are grouped; each trains the same weights as the plain run."""

from __future__ import annotations

from dataclasses import replace

import torch
from ppo_helpers import PAD, assert_same_trained_weights, prompt_batch

from rlhf_lit.models.generation import SamplingConfig


# ---------------------------------------------------------------- unattended padding columns
def test_minibatches_drop_only_the_padding_columns_no_row_attends():
    """Prompt lengths 2, 4 | 1, 3 of P = 5 (left padded), R = 2: the minibatch of rows (0, 1) drops
    1 column, the one of rows (2, 3) drops 2; responses and per-token fields are untouched."""
    from rlhf_lit.stages.ppo.rollout import Rollout, minibatches

    lengths, P, R = [2, 4, 1, 3], 5, 2
    mask = torch.tensor([[0] * (P - n) + [1] * n + [1] * R for n in lengths])  # (4, 7)
    ids = torch.arange(4 * (P + R)).view(4, P + R) * mask + PAD * (1 - mask)
    per_token = torch.arange(8.0).view(4, R)
    rollout = Rollout(
        query_responses=ids,
        attention_mask=mask,
        response_ids=ids[:, P:],
        response_mask=torch.ones(4, R, dtype=torch.bool),
        ended=torch.zeros(4, dtype=torch.bool),
        old_logprobs=per_token,
        ref_logprobs=per_token + 1,
        old_values=per_token + 2,
        raw_scores=torch.zeros(4),
        scores=torch.zeros(4),
        kl=per_token + 3,
        rewards=per_token + 4,
        advantages=per_token + 5,
        returns=per_token + 6,
    )

    generator = torch.Generator().manual_seed(0)
    order = torch.randperm(4, generator=torch.Generator().manual_seed(0))
    for k, mb in enumerate(minibatches(rollout, 2, generator)):
        rows = order[2 * k : 2 * k + 2]
        keep = max(lengths[r] for r in rows.tolist())  # the longest prompt of the minibatch
        assert mb.prompt_length == keep
        assert torch.equal(mb.query_responses, ids[rows, P - keep :])
        assert torch.equal(mb.attention_mask, mask[rows, P - keep :])
        assert torch.equal(mb.response_ids, ids[rows, P:])
        assert torch.equal(mb.advantages, per_token[rows] + 5)
    all_pad = replace(rollout, attention_mask=torch.cat([torch.zeros(4, P, dtype=torch.long), mask[:, P:]], 1))
    assert all(mb.prompt_length == 1 for mb in minibatches(all_pad, 2, generator))  # one column is kept


def test_dropping_padding_columns_trains_the_same_weights(tmp_path, monkeypatch):
    """PPO with and without the column drop, from one seed, on prompts of very different lengths:
    the same weights up to float rounding."""
    from ppo_helpers import tiny_module, tiny_trainer
    from torch.utils.data import DataLoader

    import rlhf_lit.stages.ppo.rollout as rollout_module
    from rlhf_lit.stages.ppo.config import PPOConfig

    texts = ["Once upon a time there was a little girl named", "The", "Tom", "A big dog ran to the park and"]
    weights, dropped = {}, []
    original = rollout_module.drop_columns
    for drop in (True, False):
        recorded = lambda mb, n: dropped.append(n) or original(mb, n)  # noqa: E731
        monkeypatch.setattr(rollout_module, "drop_columns", recorded if drop else (lambda mb, n: mb))
        torch.manual_seed(0)
        module = tiny_module(
            max_rollouts=2,
            sampling=SamplingConfig(max_new_tokens=5, temperature=0.9),
            ppo=PPOConfig(epochs=2, minibatch_size=2),
        )
        batch = prompt_batch(module.tokenizer, texts)
        tiny_trainer(tmp_path / str(drop)).fit(module, train_dataloaders=DataLoader([batch, batch], batch_size=None))
        weights[drop] = {k: v.clone() for k, v in module.policy.state_dict().items()}
    assert max(dropped) > 0  # some minibatch had columns to drop
    assert_same_trained_weights(weights[True], weights[False])


def test_packed_passes_train_the_same_weights(tmp_path, monkeypatch):
    """PPO with ``ppo.remove_padding`` on and off, from one seed, on prompts of very different
    lengths: the packed passes ran (scoring and minibatches) and trained the same weights up to
    float rounding."""
    from ppo_helpers import tiny_module, tiny_trainer
    from torch.utils.data import DataLoader

    import rlhf_lit.models.packing as packing
    import rlhf_lit.models.scoring as scoring
    import rlhf_lit.models.teacher_forced as teacher_forced
    from rlhf_lit.stages.ppo.config import PPOConfig

    texts = ["Once upon a time there was a little girl named", "The", "Tom", "A big dog ran to the park and"]
    weights, packed_rows = {}, []

    def recording(ids, mask):
        packed_rows.append(ids.shape)
        return packing.pack_rows(ids, mask)

    for where in (teacher_forced, scoring):  # the logits passes (policy, reference) and the score heads (critic, RM)
        monkeypatch.setattr(where, "pack_rows", recording)
    for remove in (True, False):
        torch.manual_seed(0)
        module = tiny_module(
            max_rollouts=2,
            sampling=SamplingConfig(max_new_tokens=5, temperature=0.9),
            ppo=PPOConfig(epochs=2, minibatch_size=2, remove_padding=remove),
        )
        batch = prompt_batch(module.tokenizer, texts)
        tiny_trainer(tmp_path / str(remove)).fit(module, train_dataloaders=DataLoader([batch, batch], batch_size=None))
        weights[remove] = {k: v.clone() for k, v in module.policy.state_dict().items()}
        if remove:  # per rollout: policy, reference, critic, RM; 2 epochs x 2 minibatches x (policy, critic),
            assert len(packed_rows) >= 2 * (4 + 8), packed_rows  # each once per length group
            calls = len(packed_rows)
    assert len(packed_rows) == calls  # remove_padding off: no pass packed
    assert_same_trained_weights(weights[True], weights[False])


def test_length_groups_train_the_same_weights(tmp_path, monkeypatch):
    """PPO with the rows' passes in length groups (one long prompt among short ones) and with every
    row in one padded pass, from one seed: groups were formed, and the same weights up to float rounding."""
    from ppo_helpers import tiny_module, tiny_trainer
    from torch.utils.data import DataLoader

    import rlhf_lit.stages.ppo.experience as experience
    import rlhf_lit.stages.ppo.forward as forward
    from rlhf_lit.functional import length_groups
    from rlhf_lit.stages.ppo.config import PPOConfig

    texts = ["Once upon a time there was a little girl named Lily who loved to play", "The", "Tom", "A"]
    weights, formed = {}, []

    def recording(mask):
        groups = length_groups(mask)
        formed.append(len(groups))
        return groups

    for grouped in (True, False):
        one_group = lambda mask: [torch.arange(mask.shape[0])]  # noqa: E731
        for where in (experience, forward):  # the scoring chunks, the policy-and-critic passes
            monkeypatch.setattr(where, "length_groups", recording if grouped else one_group)
        torch.manual_seed(0)
        module = tiny_module(
            max_rollouts=2,
            sampling=SamplingConfig(max_new_tokens=5, temperature=0.9),
            ppo=PPOConfig(epochs=2, minibatch_size=4),
        )
        batch = prompt_batch(module.tokenizer, texts)
        tiny_trainer(tmp_path / str(grouped)).fit(module, train_dataloaders=DataLoader([batch, batch], batch_size=None))
        weights[grouped] = {k: v.clone() for k, v in module.policy.state_dict().items()}
    assert 2 in formed  # the long prompt's row was passed apart from the others
    assert_same_trained_weights(weights[True], weights[False])

"""``ppo.reuse_first_forward``: the update's first minibatch forward scores its rows while the rollout
is scored. It must train the same weights as scoring every row (up to float rounding), score fewer
rows, hold the graph only until that minibatch's loss, and refuse a minibatch it did not score."""

from __future__ import annotations

import pytest
import torch
from ppo_helpers import assert_same_trained_weights, prompt_batch, tiny_module, tiny_trainer
from torch.utils.data import DataLoader

import rlhf_lit.stages.ppo.forward as forward_module
from rlhf_lit.models.generation import SamplingConfig
from rlhf_lit.stages.ppo.config import PPOConfig
from rlhf_lit.stages.ppo.first_forward import FirstForward, first_forward, reuses_first_forward
from rlhf_lit.stages.ppo.metrics import RolloutTimer

# Prompts of very different lengths: the minibatches drop different left padding than the scoring chunk.
TEXTS = ["Once upon a time there was a little girl named", "The", "Tom", "A big dog ran to the park and"]


def _train(tmp_path, monkeypatch, reuse: bool, critic: str, old_logprobs: str) -> tuple[dict, dict, int]:
    """Two rollouts of PPO; the policy and critic weights and the rows the policy-and-critic pass read."""
    rows = []
    for name in ("policy_and_values", "critic_values"):  # the trained models' passes (eager)
        original = getattr(forward_module, name)

        def counting(*args, original=original, ids_at=2 if name == "policy_and_values" else 1):
            rows.append(args[ids_at].shape[0])  # (policy, critic, ids, ...) or (critic, ids, ...)
            return original(*args)

        monkeypatch.setattr(forward_module, name, counting)
    torch.manual_seed(0)
    module = tiny_module(
        max_rollouts=2,
        critic=critic,
        sampling=SamplingConfig(max_new_tokens=5, temperature=0.9),
        ppo=PPOConfig(epochs=2, minibatch_size=2, old_logprobs=old_logprobs, reuse_first_forward=reuse),
    )
    batch = prompt_batch(module.tokenizer, TEXTS)
    tiny_trainer(tmp_path / str(reuse)).fit(module, train_dataloaders=DataLoader([batch, batch], batch_size=None))
    critic_weights = {} if module.critic is None else {k: v.clone() for k, v in module.critic.state_dict().items()}
    return {k: v.clone() for k, v in module.policy.state_dict().items()}, critic_weights, sum(rows)


@pytest.mark.parametrize(
    ("critic", "old_logprobs"), [("separate", "rescore"), ("shared_trunk", "rescore"), ("separate", "sampling")]
)
def test_reusing_the_first_forward_trains_the_same_weights_with_fewer_rows(tmp_path, monkeypatch, critic, old_logprobs):
    """Policy and critic end where scoring every row takes them (float rounding apart), and the
    policy-and-critic pass reads one minibatch fewer per rollout."""
    runs = {reuse: _train(tmp_path, monkeypatch, reuse, critic, old_logprobs) for reuse in (True, False)}
    assert_same_trained_weights(runs[True][0], runs[False][0])
    for k, v in runs[True][1].items():
        torch.testing.assert_close(v, runs[False][1][k], rtol=1e-5, atol=1e-7, msg=k)
    # Per rollout, off: the scoring pass over 4 rows (with sampled old logprobs and a separate
    # critic: the critic's pass alone) + 2 epochs x 2 minibatches of 2; on: 2 rows fewer.
    assert runs[False][2] - runs[True][2] == 2 * 2


def _first(module, texts=TEXTS) -> tuple[FirstForward, object]:
    batch = prompt_batch(module.tokenizer, texts)
    gen = module.generate(batch)
    return first_forward(module, module.forward_passes, module.ppo.minibatch_size, gen), gen


def test_the_first_forward_scores_the_rows_the_update_draws_first():
    """Its rows are the first minibatch of epoch 0 (the rollout's shuffle stream), its outputs carry
    a graph, and the scores it gives are the no-grad scoring pass's for those rows."""
    from rlhf_lit.stages.ppo.rollout import minibatches
    from rlhf_lit.stages.ppo.seeding import STREAM_SHUFFLE

    module = tiny_module(ppo=PPOConfig(epochs=1, minibatch_size=2))
    first, gen = _first(module)
    assert first.logits.requires_grad and first.values.requires_grad
    rollout, _ = module.make_rollout(prompt_batch(module.tokenizer, TEXTS), RolloutTimer(torch.device("cpu")))
    mb = next(minibatches(rollout, 2, module.stream_generator(STREAM_SHUFFLE)))
    assert torch.equal(mb.response_ids, first.response_ids)
    assert torch.equal(gen.response_ids[first.rows], first.response_ids)
    assert sorted(torch.cat([first.rows, first.others]).tolist()) == [0, 1, 2, 3]
    scored = module.experience_maker.score_rollout(gen)  # every row by the scoring pass
    old_logprobs, _, values = first.scores(module.sampling.temperature)
    mask = gen.response_mask[first.rows]
    torch.testing.assert_close(old_logprobs[mask], scored.old_logprobs[first.rows][mask], rtol=0, atol=1e-5)
    torch.testing.assert_close(values[mask], scored.old_values[first.rows][mask], rtol=0, atol=1e-5)
    # Scored with the first forward: the same fields, the rows in the rollout's order.
    reused = module.experience_maker.score_rollout(gen, first)
    torch.testing.assert_close(reused.ref_logprobs, scored.ref_logprobs, rtol=0, atol=1e-5)
    torch.testing.assert_close(reused.rm_scores, scored.rm_scores, rtol=0, atol=1e-5)
    full = gen.response_mask
    torch.testing.assert_close(reused.old_logprobs[full], scored.old_logprobs[full], rtol=0, atol=1e-5)
    torch.testing.assert_close(reused.old_values[full], scored.old_values[full], rtol=0, atol=1e-5)


def test_a_minibatch_it_did_not_score_is_refused_and_the_graph_is_let_go():
    module = tiny_module(ppo=PPOConfig(epochs=1, minibatch_size=2))
    first, _ = _first(module)
    with pytest.raises(RuntimeError, match="not the rows"):
        first.take(first.response_ids.flip(0) + 1)
    logits, values = first.take(first.response_ids)
    assert logits.requires_grad and first.logits is None and first.values is None
    with pytest.raises(RuntimeError, match="taken already"):
        first.take(first.response_ids)


def _reuses(module) -> bool:
    return reuses_first_forward(module.ppo, module.critic is not None)


def test_it_is_on_by_default_and_off_where_it_saves_nothing():
    assert _reuses(tiny_module())
    assert not _reuses(tiny_module(ppo=PPOConfig(reuse_first_forward=False)))
    # Sampled old logprobs and no critic: the scoring runs neither the policy nor a critic.
    no_critic = tiny_module(
        ppo=PPOConfig(old_logprobs="sampling", estimator="grpo"),
        sampling=SamplingConfig(max_new_tokens=4, samples_per_prompt=2),
    )
    assert not _reuses(no_critic)

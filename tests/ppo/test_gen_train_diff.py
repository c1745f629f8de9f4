"""``policy/logprob_gen_train_diff``: the logprobs recorded while sampling against the training
pass's logprobs of the same tokens (rescore mode: the rescore; sampling mode: the update's forward
before its first optimizer step), a mean over response tokens, pads never counted."""

from __future__ import annotations

import pytest
import torch
from float32_bounds import largest_logit, logprob_bound
from ppo_helpers import EOS, PAD, STORIES, EosBias, prompt_batch, tiny_module, tiny_trainer
from torch.utils.data import DataLoader

from rlhf_lit.models.compiled_generation import cache_length
from rlhf_lit.models.generation import SamplingConfig, complete_generation
from rlhf_lit.models.teacher_forced import response_logprobs
from rlhf_lit.stages.ppo import PPOModule
from rlhf_lit.stages.ppo.config import PPOConfig
from rlhf_lit.tokenizer import load_tokenizer

KEY = "policy/logprob_gen_train_diff"
PROMPTS = ["Once upon a time, there was", "The", "Tom had a red", "A big dog"]  # 1 to 6 tokens: left padding
RESPONSES = [
    [300, 301, EOS, 302, EOS, 303],  # EOS at 2: 3 response tokens
    [310, 311, 312, 313, 314, 315],  # no EOS: 6
    [EOS, 320, 321, 322, 323, 324],  # EOS first: 1
    [330, 331, 332, 333, 334, EOS],  # EOS last: 6
]
# Added to the true logprobs to make the "recorded" ones; 100 on the pads (after the first EOS).
OFFSETS = [
    [0.1, 0.1, 1.0, 100.0, 100.0, 100.0],
    [-0.2, -0.2, -0.2, -0.2, -0.2, -0.2],
    [1.0, 100.0, 100.0, 100.0, 100.0, 100.0],
    [0.3, 0.3, 0.3, 0.3, 0.3, 1.0],
]
# By hand: |offsets| over the 3 + 6 + 1 + 6 = 16 response tokens sum to
# (0.1 + 0.1 + 1.0) + 6 * 0.2 + 1.0 + (5 * 0.3 + 1.0) = 1.2 + 1.2 + 1.0 + 2.5 = 5.9; 5.9 / 16 = 0.36875.
# (Counting one pad adds 100 / 17; leaving the EOS out gives 2.9 / 13 = 0.223.)
EXPECTED = 0.36875


class OffsetPPO(PPOModule):
    """PPO whose 'sampled' responses are RESPONSES, recorded with logprobs off by OFFSETS."""

    def generate(self, batch):
        sequences = torch.cat([batch["input_ids"], torch.tensor(RESPONSES)], dim=1)
        gen = complete_generation(sequences, batch["attention_mask"], self.stop_ids, PAD)
        with torch.no_grad():
            true = response_logprobs(self.policy, gen, self.sampling.temperature)  # (B, R)
        gen.logprobs, gen.entropy = true + torch.tensor(OFFSETS), torch.zeros_like(true)
        return gen


def _logged(tmp_path, module: PPOModule, tokenizer) -> dict[str, float]:
    trainer = tiny_trainer(tmp_path)
    trainer.fit(module, DataLoader([prompt_batch(tokenizer, PROMPTS)], batch_size=None))
    return trainer.logger.history[0]


@pytest.mark.parametrize("old_logprobs", ["rescore", "sampling"])
def test_metric_by_hand_on_a_constructed_batch(tmp_path, old_logprobs):
    """Rescore: against the rescore of the rollout. Sampling: the old logprobs are the recorded ones,
    and the two minibatches of 2 rows before the first optimizer step (grad_accum 2) cover the 4 rows:
    the token mean over them (not the mean of the two minibatch means), and no later minibatch
    (epoch 2 runs after updates that moved the policy)."""
    tokenizer = load_tokenizer(STORIES, padding_side="left")
    module = tiny_module(
        sampling=SamplingConfig(max_new_tokens=6, temperature=0.7),
        max_rollouts=1,
        ppo=PPOConfig(epochs=2, minibatch_size=2, grad_accum=2, old_logprobs=old_logprobs),
    )
    module.__class__ = OffsetPPO
    batch = prompt_batch(tokenizer, PROMPTS)
    rows = torch.cat([batch["input_ids"], torch.tensor(RESPONSES)], dim=1)
    # The "true" logprobs and the training pass's are one float32 computation in two summation
    # orders (other rows beside them, packed or padded): each token's may differ by the logprob bound.
    magnitude = largest_logit(module.policy, rows, torch.ones_like(rows), 0.7)
    logged = _logged(tmp_path, module, tokenizer)
    assert logged[KEY] == pytest.approx(
        EXPECTED, rel=0, abs=logprob_bound(module.policy.config, magnitude, rows.shape[1])
    )


@pytest.mark.parametrize(
    "old_logprobs,path",
    [
        ("rescore", "eager"),
        ("sampling", "eager"),
        pytest.param(
            "rescore", "compiled", marks=[pytest.mark.slow, pytest.mark.kernels]
        ),  # compiles decode and passes
        pytest.param("sampling", "compiled", marks=[pytest.mark.slow, pytest.mark.kernels]),
    ],
)
def test_real_rollout_generation_and_training_agree_in_fp32(tmp_path, request, old_logprobs, path):
    """stories260K, fp32 on the CPU, real sampling of 8 left-padded rows with EOS at varied steps:
    the logprobs recorded while sampling and the training pass's differ by float summation order
    only (one token at a time with a KV cache against one pass over the rows), so their mean absolute
    difference is within the per-token bound of tests/float32_bounds.py at the largest logit /
    temperature (~8e-4 nats in the eager cases); a one-position shift of either differs by nats, a
    pad counted by its logprob. ``path`` compiled: the decode step (``sampling.decode``) and the
    scoring and training passes (``ppo.forward``) both compiled, on 2 of stories260K's 5 layers
    (cheaper to compile: ``two_layer_stories``, tests/conftest.py)."""
    tokenizer = load_tokenizer(STORIES, padding_side="left")
    trunk = request.getfixturevalue("two_layer_stories") if path == "compiled" else STORIES
    module = tiny_module(
        sft_model=trunk,
        reward_model=trunk,
        sampling=SamplingConfig(max_new_tokens=10, temperature=0.9, decode=path),
        max_rollouts=1,
        # two minibatches of 4 before the one optimizer step: the first forward scores
        # 4 rows, the scoring pass the other 4 (compiled: the critic-alone pass in sampling mode)
        ppo=PPOConfig(epochs=1, minibatch_size=4, grad_accum=2, old_logprobs=old_logprobs, forward=path),
    )
    for model in (module.policy, module.ref_policy):
        model.lm_head = EosBias(model.lm_head, 24.0)  # EOS at varied steps: pads after it
    module.on_fit_end = lambda: None  # no export: the wrapped head is not a transformers module
    lengths = []
    make_rollout = module.make_rollout
    magnitudes, rows = [], []  # the largest |logit| / temperature of the policy that sampled; the rows' width

    def recording(batch, timer, *args):
        rollout, experience = make_rollout(batch, timer, *args)
        lengths.extend(rollout.response_mask.sum(1).tolist())
        magnitudes.append(largest_logit(module.policy, rollout.query_responses, rollout.attention_mask, 0.9))
        rows.append(rollout.query_responses.shape[1])
        return rollout, experience

    module.make_rollout = recording
    trainer = tiny_trainer(tmp_path)
    trainer.fit(module, DataLoader([prompt_batch(tokenizer, PROMPTS * 2)], batch_size=None))
    assert len(set(lengths)) >= 3 and min(lengths) < 10  # rows end at different steps
    # The longest rows any of the passes sums over: the compiled step's static cache, else the rows.
    width = rows[0]
    positions = cache_length(width - 10, 10) if path == "compiled" else width
    bound = logprob_bound(module.policy.config, magnitudes[0], positions)
    assert 0.0 <= trainer.logger.history[0][KEY] <= bound
    assert ("compile/forward_graphs" in trainer.logger.history[0]) == (path == "compiled")  # the path that ran

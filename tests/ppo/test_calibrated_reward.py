"""The calibrated reward in the PPO stage (``reward.calibration: reference_quantile``): a rollout's scores
are its raw scores' quantiles among the frozen reference's samples, worked out by hand; the reference
draws leave the policy's samples as they were; an ensemble is calibrated on its aggregate with the
reward functions in the raw score; the settings that do nothing are refused; a resume stays exact."""

from __future__ import annotations

import math

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from ppo_helpers import EOS, PAD, STORIES, TINYSTORIES, EosBias, prompt_batch, tiny_module, tiny_trainer

from rlhf_lit.data import PromptDataModule
from rlhf_lit.models.generation import SamplingConfig, complete_generation
from rlhf_lit.stages.ppo import PPOModule
from rlhf_lit.stages.ppo.config import KLConfig, PPOConfig, RewardConfig, RewardSource
from rlhf_lit.stages.ppo.estimator import repeat_prompts
from rlhf_lit.stages.ppo.experience import sample_responses
from rlhf_lit.stages.ppo.metrics import RolloutTimer
from rlhf_lit.stages.ppo.reference_calibration import ReferenceCalibration
from rlhf_lit.stages.ppo.reward_sources import RewardSources
from rlhf_lit.stages.ppo.seeding import STREAM_REFERENCE, stream_generator

K = 4
CALIBRATED = RewardConfig(calibration="reference_quantile", calibration_samples=K)
PROMPTS = ["Once upon a time", "Tom had a red"]


class LengthScored(PPOModule):
    """PPO whose reward model scores a row by its attended tokens (prompt + response: ties are common)."""

    def score(self, query_responses, attention_mask):
        return attention_mask.sum(1).float()


def _module(reward: RewardConfig) -> PPOModule:
    module = tiny_module(
        reward=reward,
        sampling=SamplingConfig(max_new_tokens=6, temperature=1.0, samples_per_prompt=2),
        ppo=PPOConfig(epochs=1, minibatch_size=2),
        kl=KLConfig(kind="fixed", init_coef=0.0),
    )
    module.__class__ = LengthScored
    # Responses end at varied steps (the EOS logit raised to where it competes), earlier under the
    # policy than under the reference: the two draw from different distributions, so a quantile
    # among the policy's own samples, or references drawn from the policy, would show.
    module.policy.lm_head = EosBias(module.policy.lm_head, 24.0)
    module.ref_policy.lm_head = EosBias(module.ref_policy.lm_head, 23.0)
    return module


def _by_hand(score: float, references: list[float]) -> float:
    below = sum(r < score for r in references)
    ties = sum(r == score for r in references)
    return (below + ties / 2 + 0.5) / (len(references) + 1)


def test_a_rollouts_scores_are_its_quantiles_among_the_reference_samples_and_the_policy_samples_stay():
    module = _module(CALIBRATED)
    drawn = []
    sample = module.experience_maker.calibration.sample
    module.experience_maker.calibration.sample = lambda stage, prompts: (
        drawn.append(sample(stage, prompts)) or drawn[-1]
    )
    batch = prompt_batch(module.tokenizer, PROMPTS)
    rollout, info = module.make_rollout(batch, RolloutTimer(torch.device("cpu")))

    # The reference draws, again by hand: the frozen reference, K rows per prompt, the reference stream.
    (gen,) = drawn
    # with the module's sampling settings, stop ids and pad (PAD); rollout_seed 7, rank 0, rollout 0
    again = sample_responses(
        module.ref_policy, repeat_prompts(batch, K), module, stream_generator(7, 0, 0, STREAM_REFERENCE)
    )
    assert torch.equal(gen.query_responses, again.query_responses)
    references = gen.attention_mask.sum(1).float().view(len(PROMPTS), K).tolist()  # what LengthScored gives them
    raw = rollout.attention_mask.sum(1).float()
    assert torch.equal(rollout.raw_scores, raw)  # objective/scores stays the raw score
    # Row i is prompt i // 2's (samples_per_prompt 2); identity transform, no bias, whitening or penalty.
    expected = [_by_hand(s, references[i // 2]) for i, s in enumerate(raw.tolist())]
    assert rollout.scores.tolist() == pytest.approx(expected, abs=1e-7)
    assert info.reward_parts["reward/quantile"].item() == pytest.approx(sum(expected) / 4)
    assert info.reward_parts["reward/reference"].item() == pytest.approx(sum(map(sum, references)) / (2 * K))
    assert len(set(expected)) > 1 and min(expected) < 0.5  # the table is not trivial: the policy ends earlier

    # Calibration off, the same seed: the policy samples exactly what it sampled with it on.
    plain = _module(RewardConfig())
    assert plain.experience_maker.calibration is None
    rollout_off, _ = plain.make_rollout(batch, RolloutTimer(torch.device("cpu")))
    assert torch.equal(rollout_off.query_responses, rollout.query_responses)


def test_with_lora_the_references_come_from_the_policy_with_its_adapters_disabled():
    from rlhf_lit.models import load_causal_lm
    from rlhf_lit.models.lora import LoRAConfig

    module = tiny_module(
        lora=LoRAConfig(r=4, alpha=8.0), reward=CALIBRATED, sampling=SamplingConfig(max_new_tokens=6, temperature=1.0)
    )
    with torch.no_grad():  # trained adapters: the policy no longer samples as the SFT model does
        for name, p in module.policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(0)))
    batch = repeat_prompts(prompt_batch(module.tokenizer, PROMPTS), K)
    drawn = module.experience_maker.calibration.sample(module, batch)
    sft = load_causal_lm(STORIES, module.tokenizer).eval()
    expected = sample_responses(sft, batch, module, stream_generator(7, 0, 0, STREAM_REFERENCE))
    assert torch.equal(drawn.query_responses, expected.query_responses)
    adapted = sample_responses(module.policy, batch, module, stream_generator(7, 0, 0, STREAM_REFERENCE))
    assert not torch.equal(adapted.query_responses, expected.query_responses)  # the test can tell them apart


class _Reference:
    """A reference that 'samples' fixed responses."""

    def __init__(self, gen):
        self.gen = gen

    def apply(self, fn, *args):
        return self.gen


class _Stage:
    """Scores every row with two ensemble members' fixed scores; the reference, sources and tokenizer given."""

    def __init__(self, members, reference, reward_sources, tokenizer):
        self.members, self.reference, self.reward_sources, self.tokenizer = (
            members,
            reference,
            reward_sources,
            tokenizer,
        )
        self.sampling, self.ppo, self.stop_ids = SamplingConfig(), PPOConfig(), (EOS,)

    def stream_generator(self, stream):
        return torch.Generator().manual_seed(stream)

    def reward_model_inputs(self, gen):
        return gen.query_responses, gen.attention_mask

    def score(self, ids, mask):
        return self.members


def test_an_ensemble_is_calibrated_on_its_aggregate_with_the_reward_functions_in_the_raw_score(tokenizer):
    # One prompt, K = 3 reference responses of 1, 2 and 3 tokens (EOS last).
    prompts = {"input_ids": torch.tensor([[5, 6]] * 3), "attention_mask": torch.ones(3, 2, dtype=torch.long)}
    responses = torch.tensor([[EOS, PAD, PAD], [300, EOS, PAD], [300, 301, EOS]])
    gen = complete_generation(torch.cat([prompts["input_ids"], responses], 1), prompts["attention_mask"], EOS, PAD)
    members = torch.tensor([[1.0, 3.0], [0.5, -1.0], [2.0, 2.5]])  # (3, 2)
    sources = [
        RewardSource(name="reward_model", aggregate="worst_case"),
        RewardSource(name="parts", function="ppo_helpers:two_part_reward", weight=0.5),
    ]
    reward = RewardConfig(
        sources=sources, calibration="reference_quantile", calibration_samples=3, calibration_transform="log"
    )
    calibration = ReferenceCalibration(reward, sample_responses)
    drawn = calibration.draw(_Stage(members, _Reference(gen), RewardSources(sources), tokenizer), prompts)
    # worst case of the members + 0.5 * (length + 1): 1.0 + 0.5 * 2 = 2.0; -1.0 + 0.5 * 3 = 0.5; 2.0 + 0.5 * 4 = 4.0
    assert drawn.tolist() == [[2.0, 0.5, 4.0]]
    calibrated, parts = calibration.calibrate(torch.tensor([2.0, 5.0]), torch.tensor([[2.0, 0.5, 4.0]]))
    # 2.0: below 1, ties 1 -> (1 + 0.5 + 0.5) / 4 = 0.5; 5.0: above all -> 3.5 / 4 = 0.875
    assert calibrated.tolist() == pytest.approx([math.log(0.5), math.log(0.875)])
    assert parts["reward/quantile"].tolist() == pytest.approx([0.5, 0.875])
    nan, _ = calibration.calibrate(torch.tensor([float("nan"), 1.0]), torch.tensor([[2.0, 0.5, 4.0]]))
    assert nan.isnan().all()  # a NaN score makes the rollout non-finite: skipped and counted, not ranked


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"calibration_transform": "log"}, "apply to reward.calibration: reference_quantile"),
        ({"calibration": "reference_quantile", "calibration_transform": "best_of_n"}, "calibration_n"),
        ({"calibration": "reference_quantile", "calibration_n": 4}, "goes with calibration_transform: best_of_n"),
        ({"calibration": "reference_quantile", "calibration_transform": "best_of_n", "calibration_n": 1}, ">= 2"),
        ({"calibration": "reference_quantile", "calibration_samples": 0}, "calibration_samples must be >= 1"),
        ({"calibration": "quantile"}, "must be one of none, reference_quantile"),
    ],
)
def test_calibration_settings_that_cannot_work_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        RewardConfig(**settings)


def test_resume_with_calibration_is_exact(tmp_path):
    def module():
        return tiny_module(reward=CALIBRATED, ppo=PPOConfig(epochs=1, minibatch_size=2), max_rollouts=2)

    def data(m):
        return PromptDataModule(
            tokenizer=m.tokenizer, train_path=TINYSTORIES, format="paragraphs", max_records=8, batch_size=2, seed=3
        )

    straight = module()
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1, filename="{step}")
    trainer = tiny_trainer(tmp_path, enable_checkpointing=True, callbacks=[ckpt])  # 2 optimizer steps a rollout
    trainer.fit(straight, data(straight))
    full = trainer.logger.history
    resumed = module()
    trainer = tiny_trainer(tmp_path / "resume")
    trainer.fit(resumed, data(resumed), ckpt_path=str(tmp_path / "ckpt" / "step=2.ckpt"))
    part = trainer.logger.history
    assert sorted(part) == [1]
    a, b = ({k: v for k, v in h[1].items() if not k.startswith("time/")} for h in (full, part))
    assert a.keys() == b.keys() and "reward/reference" in a
    for name in a:
        assert a[name] == pytest.approx(b[name], rel=1e-6, abs=1e-7), name
    for p, q in zip(straight.policy.parameters(), resumed.policy.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_a_checkpoint_from_before_calibration_resumes_with_it_off_and_is_refused_with_it_on():
    from dataclasses import asdict

    from rlhf_lit.stages.resume import ResumeMismatch, check_resume, init_defaults

    older = {k: v for k, v in asdict(RewardConfig()).items() if not k.startswith("calibration")}  # as written before
    checkpoint = {"hyper_parameters": {"reward": older}}
    check_resume(checkpoint, {"reward": asdict(RewardConfig())}, None, (), None, init_defaults(PPOModule))
    with pytest.raises(
        ResumeMismatch, match=r"model.reward.calibration: checkpoint \(not set\), now 'reference_quantile'"
    ):
        check_resume(checkpoint, {"reward": asdict(CALIBRATED)}, None, (), None, init_defaults(PPOModule))

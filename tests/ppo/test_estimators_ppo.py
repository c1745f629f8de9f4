"""The critic-free estimators wired into PPOModule: k samples per prompt, group advantages, no critic.

One rollout of 2 prompts x k = 3 samples on stories260K (real sampling, a random-head RM, so every
row scores differently). The expected advantages are computed here from the rollout's scores,
grouping rows by their actual prompt tokens (not by position), with plain Python arithmetic.
"""

from __future__ import annotations

import math

import pytest
import torch
from lightning.pytorch import LightningDataModule
from ppo_helpers import EOS, STORIES, prompt_batch, tiny_module, tiny_trainer
from torch.utils.data import DataLoader

from rlhf_lit.models import load_causal_lm
from rlhf_lit.models.generation import SamplingConfig
from rlhf_lit.stages.optim import OptimizerConfig
from rlhf_lit.stages.ppo.config import KLConfig, PPOConfig

PROMPTS = ["Once upon a time, there was", "Tom had a red"]
K = 3


class OnePromptBatch(LightningDataModule):
    """One left-padded prompt batch per epoch; records what PPO reports as consumed."""

    def __init__(self, batch: dict) -> None:
        super().__init__()
        self.batch, self.consumed, self.batch_size = batch, [], len(batch["input_ids"])

    def train_dataloader(self):
        return DataLoader([self.batch], batch_size=None, collate_fn=lambda b: b)

    def mark_consumed(self, n: int) -> None:
        self.consumed.append(n)


def run_one_rollout(
    tmp_path,
    perturb: float = 0.0,
    record: dict | None = None,
    eos_bias: float = 0.0,
    perturb_only: str | None = None,
    **overrides,
):
    """Fit one rollout; returns (module, rollout, data, logged metrics, trainer). ``perturb`` moves the
    policy away from the reference (KL != 0), only the parameters whose name holds ``perturb_only`` when
    given; ``eos_bias`` is added to the policy's EOS logit (rows end at varied steps); ``record`` receives
    the minibatch losses and stats."""
    kwargs = dict(
        sampling=SamplingConfig(max_new_tokens=6, temperature=1.0, samples_per_prompt=K),
        ppo=PPOConfig(epochs=1, minibatch_size=3, estimator="grpo"),
        kl=KLConfig(kind="fixed", init_coef=0.1),
        optimizer=OptimizerConfig(lr=1e-3, eps=1e-5),
        max_rollouts=1,
    )
    kwargs.update(overrides)
    module = tiny_module(**kwargs)
    if perturb:
        generator = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for name, p in module.policy.named_parameters():
                if perturb_only is None or perturb_only in name:
                    p.add_(torch.randn(p.shape, generator=generator) * perturb)
    if eos_bias:  # a forward hook, not a wrapped head: the export's tied weights stay as they are
        eos = torch.nn.functional.one_hot(torch.tensor(EOS), module.policy.config.vocab_size) * eos_bias
        module.policy.lm_head.register_forward_hook(lambda _module, _inputs, logits: logits + eos)
    record = {} if record is None else record
    record["minibatches"] = []
    make_rollout, minibatch_loss = module.make_rollout, module.minibatch_loss

    def recording_loss(mb, *args):
        loss, stats = minibatch_loss(mb, *args)
        record["minibatches"].append((float(loss.detach()), {k: float(v) for k, v in stats.logged.items()}))
        return loss, stats

    module.minibatch_loss = recording_loss

    def recording(batch, timer, *args):
        rollout, stats = make_rollout(batch, timer, *args)
        record["rollout"] = rollout
        return rollout, stats

    module.make_rollout = recording
    data = OnePromptBatch(prompt_batch(module.tokenizer, PROMPTS))
    trainer = tiny_trainer(tmp_path)
    trainer.fit(module, datamodule=data)
    return module, record["rollout"], data, trainer.logger.history[0], trainer


def groups_by_prompt(rollout) -> list[list[int]]:
    """Row indices grouped by the prompt tokens they start with, in order of first appearance."""
    prompts = rollout.query_responses[:, : rollout.prompt_length]
    groups: dict[tuple, list[int]] = {}
    for i, row in enumerate(prompts.tolist()):
        groups.setdefault(tuple(row), []).append(i)
    return list(groups.values())


def sequence_rewards(rollout) -> list[float]:
    """Score minus the summed KL penalty: what the group estimators score (0.1 = the fixed coef)."""
    return [float(s) - 0.1 * float(k) for s, k in zip(rollout.scores, rollout.kl.sum(1))]


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory):
    return run_one_rollout(tmp_path_factory.mktemp("grpo"))


def test_each_prompt_is_repeated_k_times_as_consecutive_rows(grpo_run):
    module, rollout, data, _, _ = grpo_run
    assert rollout.batch_size == len(PROMPTS) * K
    assert groups_by_prompt(rollout) == [[0, 1, 2], [3, 4, 5]]
    # The k samples of a prompt differ (the per-rank generator draws for every row).
    responses = rollout.response_ids.tolist()
    assert len({tuple(r) for r in responses[:3]}) > 1 and len({tuple(r) for r in responses[3:]}) > 1
    assert data.consumed == [len(PROMPTS)]  # prompts, not rows: the data position stays right


def test_grpo_advantages_are_the_group_normalised_sequence_rewards(grpo_run):
    _, rollout, _, _, _ = grpo_run
    rewards = sequence_rewards(rollout)
    assert len({round(r, 4) for r in rewards}) == 6  # not degenerate
    for group in groups_by_prompt(rollout):
        values = [rewards[i] for i in group]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))  # unbiased, as TRL
        for i in group:
            expected = (rewards[i] - mean) / (std + 1e-4)
            n = int(rollout.response_mask[i].sum())
            assert rollout.advantages[i, :n].tolist() == pytest.approx([expected] * n, rel=1e-4, abs=1e-5)
            assert (rollout.advantages[i, n:] == 0).all()
    torch.testing.assert_close(rollout.returns, rollout.advantages)


def test_critic_free_estimator_builds_no_critic_and_one_optimizer(grpo_run):
    module, rollout, _, metrics, trainer = grpo_run
    assert module.critic is None
    assert len(trainer.optimizers) == 1
    policy_params = {id(p) for p in module.policy.parameters()}
    assert {id(p) for g in trainer.optimizers[0].param_groups for p in g["params"]} == policy_params
    assert not any(k.startswith("critic.") for k in module.state_dict())
    assert "lr_critic" not in metrics and "value/explained_variance" not in metrics
    assert (rollout.old_values == 0).all()


@pytest.mark.parametrize("estimator", ["rloo", "dr_grpo", "reinforce_pp"])
def test_other_critic_free_estimators(tmp_path, estimator):
    module, rollout, _, _, trainer = run_one_rollout(
        tmp_path, ppo=PPOConfig(epochs=1, minibatch_size=3, estimator=estimator)
    )
    assert module.critic is None and len(trainer.optimizers) == 1
    rewards = sequence_rewards(rollout)
    if estimator == "reinforce_pp":  # gamma 1: the return-to-go at token 0 is the whole sequence reward
        torch.testing.assert_close(rollout.returns[:, 0], torch.tensor(rewards), rtol=1e-5, atol=1e-5)
        return
    for group in groups_by_prompt(rollout):
        values = [rewards[i] for i in group]
        for j, i in enumerate(group):
            others = [v for jj, v in enumerate(values) if jj != j]
            if estimator == "rloo":
                expected = values[j] - sum(others) / len(others)
            else:
                expected = values[j] - sum(values) / len(values)
            assert float(rollout.advantages[i, 0]) == pytest.approx(expected, rel=1e-4, abs=1e-5)


def test_group_estimators_refuse_one_sample_per_prompt():
    with pytest.raises(ValueError, match="samples_per_prompt >= 2"):
        tiny_module(ppo=PPOConfig(estimator="grpo"))


def test_critic_settings_are_refused_without_a_critic():
    with pytest.raises(ValueError, match="trains no critic; leave critic_optimizer"):
        tiny_module(ppo=PPOConfig(estimator="reinforce_pp"), critic_optimizer=OptimizerConfig())


def test_rows_not_divisible_into_steps_are_refused(tmp_path):
    # 2 prompts x 3 samples = 6 rows; a step of 4 rows does not divide them.
    with pytest.raises(ValueError, match=r"6 rows per process.*samples_per_prompt 3"):
        run_one_rollout(tmp_path, ppo=PPOConfig(epochs=1, minibatch_size=4, estimator="grpo"))


BETA = 0.2


@pytest.fixture(scope="module")
def kl_loss_run(tmp_path_factory):
    record = {}
    out = run_one_rollout(
        tmp_path_factory.mktemp("kl-loss"),
        perturb=0.02,
        record=record,
        ppo=PPOConfig(epochs=1, minibatch_size=6, estimator="grpo"),
        kl=KLConfig(kind="adaptive", init_coef=BETA, target=1.0, horizon=100, estimator="k3", mode="loss"),
    )
    return (*out, record)


def test_kl_mode_loss_puts_no_kl_in_the_rewards(kl_loss_run):
    _, rollout, _, _, _, _ = kl_loss_run
    mask = rollout.response_mask
    assert float(rollout.kl[mask].abs().min()) > 1e-4  # the policy left the reference: KL is measured
    last = mask.sum(1) - 1  # (B,)
    expected = torch.zeros_like(rollout.rewards)
    expected[torch.arange(rollout.batch_size), last] = rollout.scores
    assert torch.equal(rollout.rewards, expected)  # only the score, on the last response token


def test_kl_mode_loss_adds_beta_times_the_kl_to_the_loss(kl_loss_run):
    _, rollout, _, _, _, record = kl_loss_run
    # One minibatch (the whole rollout, any order), before the step: the ratio is exactly 1, so the
    # clipped surrogate is -mean(advantages) over the response tokens, and the default loss estimator
    # (k3 times that ratio) is k3 = e^r - 1 - r with r = ref_logprob - logprob at the rollout's logprobs.
    # Its gradients: tests/ppo/test_kl_loss_term.py.
    mask = rollout.response_mask
    adv = rollout.advantages[mask].double().tolist()
    r = (rollout.ref_logprobs - rollout.old_logprobs)[mask].double().tolist()
    k3 = [math.exp(x) - 1 - x for x in r]
    expected_kl = sum(k3) / len(k3)
    expected = -sum(adv) / len(adv) + BETA * expected_kl
    ((loss, stats),) = record["minibatches"]
    assert stats["loss/kl"] == pytest.approx(expected_kl, rel=1e-4)
    assert expected_kl > 1e-3 and BETA * expected_kl > 10 * abs(sum(adv) / len(adv))  # the KL term matters
    assert loss == pytest.approx(expected, rel=1e-4, abs=1e-6)


def test_kl_mode_loss_still_steers_the_adaptive_controller(kl_loss_run):
    module, rollout, _, metrics, _, _ = kl_loss_run
    kl_mean = float(rollout.kl.sum(1).mean())
    assert metrics["objective/kl"] == pytest.approx(kl_mean, rel=1e-5)
    error = max(-0.2, min(0.2, kl_mean / 1.0 - 1.0))  # Ziegler et al. eq. 2, error clipped to +-0.2
    assert module.kl_ctl.value == pytest.approx(BETA * (1 + error * 6 / 100), rel=1e-6)
    assert module.kl_ctl.value != BETA


LEARNING_ROLLOUTS = 30


def test_grpo_with_a_rule_reward_raises_that_reward(tmp_path):
    """GRPO (k = 4, no critic, KL as a loss term: the default estimator, k3 times pi / pi_old) on
    stories260K with a rule reward, the count of "." tokens in the response (a reward function, not an
    RM): its mean rises. Measured once (seed 7, 30 rollouts, ~10 s): 0.90 over the first 10 rollouts ->
    1.36 over the last 10 (with GRPO's plain k3 in the loss: 0.90 -> 1.40)."""
    from ppo_helpers import STORIES, TINYSTORIES

    from rlhf_lit.data import PromptDataModule
    from rlhf_lit.stages.ppo.config import RewardConfig, RewardSource
    from rlhf_lit.tokenizer import load_tokenizer

    dot = load_tokenizer(STORIES).convert_tokens_to_ids(".")

    module = tiny_module(
        reward_model=None,
        sampling=SamplingConfig(max_new_tokens=16, samples_per_prompt=4),
        ppo=PPOConfig(epochs=1, minibatch_size=16, estimator="grpo"),
        kl=KLConfig(kind="fixed", init_coef=0.04, estimator="k3", mode="loss"),
        reward=RewardConfig(
            sources=[RewardSource(name="dots", function="ppo_helpers:dot_count_reward", kwargs={"token": dot})]
        ),
        optimizer=OptimizerConfig(lr=1e-4, eps=1e-5),
        max_rollouts=LEARNING_ROLLOUTS,
    )
    data = PromptDataModule(
        tokenizer=module.tokenizer,
        train_path=TINYSTORIES,
        format="paragraphs",
        max_records=256,
        batch_size=4,
        prompt_words=6,
        seed=0,
    )
    trainer = tiny_trainer(tmp_path)
    trainer.fit(module, data)
    history = trainer.logger.history
    dots = [history[i]["reward/dots"] for i in range(LEARNING_ROLLOUTS)]
    print("dots", [round(d, 2) for d in dots])
    assert module.critic is None
    assert sum(dots[-10:]) / 10 > sum(dots[:10]) / 10 + 0.2


@pytest.mark.parametrize("remove_padding", [False, True])
def test_the_exact_kl_loss_is_the_kl_of_the_whole_distributions_at_the_rollouts_prefixes(tmp_path, remove_padding):
    """``kl.loss_estimator: exact`` in a fit with a critic (GAE): the logged term equals the KL of the
    policy's and the reference's next-token distributions (at the sampling temperature) summed over the
    vocabulary, averaged over the response tokens, recomputed here from two plain forward passes (lr 1e-12:
    the policy after the fit is the minibatch's to float rounding). Packed rows (``remove_padding``) give
    the same term: their zero logits after a row's end are off the mask."""
    record = {}
    temperature = 0.9
    module, rollout, _, _, _ = run_one_rollout(
        tmp_path,
        perturb=0.02,
        record=record,
        eos_bias=24.0,
        sampling=SamplingConfig(max_new_tokens=6, temperature=temperature, samples_per_prompt=K),
        ppo=PPOConfig(epochs=1, minibatch_size=6, remove_padding=remove_padding),
        kl=KLConfig(kind="fixed", init_coef=BETA, mode="loss", loss_estimator="exact"),
        optimizer=OptimizerConfig(lr=1e-12, eps=1e-5),
    )
    ids, mask, p = rollout.query_responses, rollout.attention_mask, rollout.prompt_length
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    reference = load_causal_lm(STORIES).eval()
    with torch.no_grad():
        log_pi = torch.log_softmax(
            module.policy(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, p - 1 : -1].double()
            / temperature,
            -1,
        )
        log_ref = torch.log_softmax(
            reference(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, p - 1 : -1].double()
            / temperature,
            -1,
        )
    per_token = (log_pi.exp() * (log_pi - log_ref)).sum(-1)[rollout.response_mask]
    # Some rows ended early: their positions after EOS (pad) must not count.
    assert 0 < int((~rollout.response_mask).sum()) and bool(rollout.ended.any())
    ((_, stats),) = record["minibatches"]
    assert float(per_token.mean()) > 1e-3  # the perturbed policy is away from the reference
    assert stats["loss/kl"] == pytest.approx(float(per_token.mean()), rel=1e-4)


def test_the_exact_kl_loss_with_lora_reads_the_policy_with_its_adapters_disabled(tmp_path):
    """With LoRA the reference is the policy with its adapters disabled (the same EOS-biased head): the
    term equals the KL to the base model with that head, recomputed here from a separate copy."""
    from rlhf_lit.models.lora import LoRAConfig

    record, bias = {}, 24.0
    module, rollout, _, _, _ = run_one_rollout(
        tmp_path,
        perturb=0.05,
        perturb_only="lora_B",
        record=record,
        eos_bias=bias,
        lora=LoRAConfig(r=4, alpha=8.0),
        sampling=SamplingConfig(max_new_tokens=6, temperature=1.0, samples_per_prompt=K),
        ppo=PPOConfig(epochs=1, minibatch_size=6),
        kl=KLConfig(kind="fixed", init_coef=BETA, mode="loss", loss_estimator="exact"),
        optimizer=OptimizerConfig(lr=1e-12, eps=1e-5),
    )
    ids, mask, p = rollout.query_responses, rollout.attention_mask, rollout.prompt_length
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    base = load_causal_lm(STORIES).eval()
    eos = torch.nn.functional.one_hot(torch.tensor(EOS), base.config.vocab_size) * bias
    base.lm_head.register_forward_hook(lambda _module, _inputs, logits: logits + eos)
    with torch.no_grad():
        policy_logits = module.policy(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        base_logits = base(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    log_pi = torch.log_softmax(policy_logits[:, p - 1 : -1].double(), -1)
    log_ref = torch.log_softmax(base_logits[:, p - 1 : -1].double(), -1)
    per_token = (log_pi.exp() * (log_pi - log_ref)).sum(-1)[rollout.response_mask]
    ((_, stats),) = record["minibatches"]
    assert float(per_token.mean()) > 1e-3  # the adapters moved the policy
    assert stats["loss/kl"] == pytest.approx(float(per_token.mean()), rel=1e-4)

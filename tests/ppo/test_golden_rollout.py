"""The golden rollout: every tensor of one PPO iteration against an independent loop re-implementation.

One small batch exercises the whole wiring of ``PPOModule`` at once: left padding (prompts of 1 to
6 tokens), responses of different lengths (EOS at 2, at 0 and at the last position, and one
truncated row with junk never cut), a policy perturbed away from the reference (KL is not 0), a
critic from a reward model with a non-zero head and an unfolded normalisation bias, sampling
temperature 0.7, the missing-EOS penalty, a reward bias, grad_accum 2, an entropy bonus and
PPO-ptx. The eager case runs stories260K; the compiled one a copy with 2 of its 5 decoder layers
(``two_layer_stories`` in tests/conftest.py: 3 layers fewer for TorchInductor to lower), each with
its own perturbation and KL target (:class:`Case`). ``tests/ppo/golden_reference.py`` recomputes
each quantity one unpadded row at a time from the formulas, without ``rlhf_lit``; this file compares:

- the rollout: old and reference logprobs, values, RM scores, shaped scores, per-token KL,
  rewards, advantages and returns (on response tokens; 0 where the module promises 0);
- each minibatch's policy, value, entropy and ptx losses;
- the gradient of every policy and critic parameter at each optimizer step (2 steps, each the
  sum of 2 minibatches / grad_accum; the second after an update, so the ratio is not 1);
- the adaptive controller after the rollout, and the logged KL.

Tolerances: quantities are float32 computed two ways (a padded batch, eager or compiled, against
unpadded rows): each comparison's bound is derived in golden_bounds.py from the
float32 error of another summation order (tests/float32_bounds.py) at the magnitudes of this batch,
carried through the formulas (KL, shaped rewards, GAE, whitening, the losses). They came to ~1e-3
of the logprobs' nats in the eager case; every planted wiring bug moves them by 1e-2 or more.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import golden_bounds
import golden_reference as ref
import pytest
import torch
from lightning.pytorch import LightningDataModule
from ppo_helpers import EOS, PAD, STORIES, prompt_batch, tiny_module, tiny_trainer
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from rlhf_lit.models.generation import SamplingConfig, complete_generation
from rlhf_lit.stages.optim import OptimizerConfig
from rlhf_lit.stages.ppo import PPOModule
from rlhf_lit.stages.ppo_config import KLConfig, PPOConfig, RewardConfig

PROMPTS = ["Once upon a time, there was", "The", "Tom had a red", "A big dog"]
# R = 6; after the first EOS anything may follow (it must become pad and be ignored).
RESPONSES = [
    [300, 301, EOS, 302, EOS, 303],  # EOS at 2
    [310, 311, 312, 313, 314, 315],  # truncated: no EOS
    [EOS, 320, 321, 322, 323, 324],  # EOS first: a one-token response
    [330, 331, 332, 333, 334, EOS],  # EOS at the last position
]
TEMPERATURE, BETA, REWARD_OFFSET, SCORE_BIAS, MISSING_EOS = 0.7, 0.3, 0.5, 0.25, -1.0
PPO = PPOConfig(
    epochs=2,
    minibatch_size=1,
    grad_accum=2,
    clip_range=0.2,
    value_clip_range=0.2,
    vf_coef=0.3,
    gamma=0.9,
    lam=0.8,
    entropy_coef=0.05,
    max_grad_norm=None,
    ptx_coef=0.5,
)  # 4 rows / (1 x 2) = 2 optimizer steps per epoch, 4 in all


class ScriptedPPO(PPOModule):
    """PPO whose policy 'samples' RESPONSES (through the real masking code); everything else is real."""

    def generate(self, batch):
        sequences = torch.cat([batch["input_ids"], torch.tensor(RESPONSES)], dim=1)
        return complete_generation(sequences, batch["attention_mask"], self.stop_ids, PAD)


class PromptsAndPtx(LightningDataModule):
    """One prompt batch for the rollout; three distinct right-padded SFT batches for PPO-ptx, recorded as drawn."""

    def __init__(self, tokenizer) -> None:
        super().__init__()
        self.prompts = prompt_batch(tokenizer, PROMPTS)
        self.ptx = [
            {
                "input_ids": torch.tensor([[1, 300 + i, 301, 302, EOS], [1, 310, 311 + i, EOS, PAD]]),
                "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]),
                "labels": torch.tensor([[-100, -100, 301, 302, EOS], [-100, 310, 311 + i, EOS, -100]]),
            }
            for i in range(3)
        ]
        self.drawn: list[dict[str, torch.Tensor]] = []

    def train_dataloader(self):
        return DataLoader([self.prompts], batch_size=None)

    def ptx_dataloader(self):
        return self

    def __iter__(self):
        for batch in self.ptx:
            self.drawn.append(batch)
            yield batch


class Case(NamedTuple):
    """One golden run: the passes (``ppo.forward``), the trunk of every model, how far the policy is
    moved off the reference, and the adaptive controller's KL target, just under the KL that move
    gives, so the controller's error stays inside its clip and its value depends on the KL fed in."""

    forward: str
    trunk: str
    perturbation: float
    kl_target: float


@pytest.fixture(
    scope="module", params=["eager", pytest.param("compiled", marks=[pytest.mark.slow, pytest.mark.kernels])]
)
def case(request) -> Case:
    """Eager on stories260K (KL 7.9 nats a response at perturbation 0.02); compiled on its 2-layer copy
    (KL 9.9 at 0.05), cheaper to compile."""
    if request.param == "eager":
        return Case("eager", STORIES, perturbation=0.02, kl_target=7.0)
    return Case("compiled", request.getfixturevalue("two_layer_stories"), perturbation=0.05, kl_target=9.0)


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory, case) -> str:
    """A reward model on the case's trunk with a random head and a bias it could not fold (as
    RewardModule exports Llama)."""
    path = tmp_path_factory.mktemp("golden-rm")
    torch.manual_seed(11)
    rm = AutoModelForSequenceClassification.from_pretrained(case.trunk, num_labels=1)
    torch.nn.init.normal_(rm.score.weight, std=0.5)
    rm.config.reward_bias = REWARD_OFFSET
    rm.save_pretrained(path)
    return str(path)


def _perturb(model: torch.nn.Module, seed: int, scale: float) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * scale)


def _named(module: torch.nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in module.named_parameters()}


@pytest.fixture(scope="module")
def golden(case, reward_model_dir, tmp_path_factory):
    """Run one rollout through Trainer.fit and record everything the module produced, with the
    scoring and minibatch passes eager or compiled (``ppo.forward``): both must match the loop
    reference within the same float32 tolerances."""
    module = tiny_module(
        sft_model=case.trunk,
        reward_model=reward_model_dir,
        sampling=SamplingConfig(max_new_tokens=len(RESPONSES[0]), temperature=TEMPERATURE),
        ppo=replace(PPO, forward=case.forward),
        reward=RewardConfig(bias=SCORE_BIAS, missing_eos_penalty=MISSING_EOS),
        kl=KLConfig(kind="adaptive", init_coef=BETA, target=case.kl_target, horizon=100),
        optimizer=OptimizerConfig(lr=3e-3, eps=1e-5),
        critic_optimizer=OptimizerConfig(lr=1e-2, eps=1e-5),
        max_rollouts=1,
    )
    module.__class__ = ScriptedPPO
    _perturb(module.policy, seed=5, scale=case.perturbation)  # the policy leaves the reference: KL != 0
    initial_policy = {k: v.clone() for k, v in module.policy.state_dict().items()}
    record = {"rollouts": [], "minibatches": [], "steps": []}

    make_rollout = module.make_rollout

    def recording_make_rollout(batch, timer, *args):
        rollout, entropy = make_rollout(batch, timer, *args)
        record["rollouts"].append(rollout)
        record["kl_coef_at_rollout"] = module.kl_ctl.value
        return rollout, entropy

    minibatch_loss = module.minibatch_loss

    def recording_minibatch_loss(mb, *args):
        loss, stats = minibatch_loss(mb, *args)
        record["minibatches"].append(
            (mb.query_responses.clone(), float(loss.detach()), {k: float(v) for k, v in stats.logged.items()})
        )
        return loss, stats

    module.make_rollout, module.minibatch_loss = recording_make_rollout, recording_minibatch_loss
    configure = module.configure_optimizers
    names = {"policy": _named(module.policy), "critic": _named(module.critic)}

    def recording_optimizers():
        optimizers, schedulers = configure()
        for which, opt in zip(("policy", "critic"), optimizers):

            def hook(o, args, kwargs, which=which):
                params = [p for g in o.param_groups for p in g["params"]]
                record["steps"].append(
                    (which, {names[which][id(p)]: (p.detach().clone(), p.grad.detach().clone()) for p in params})
                )

            opt.register_step_pre_hook(hook)
        return optimizers, schedulers

    module.configure_optimizers = recording_optimizers
    data = PromptsAndPtx(module.tokenizer)
    trainer = tiny_trainer(tmp_path_factory.mktemp("golden-run"))
    trainer.fit(module, datamodule=data)
    return module, data, record, initial_policy, trainer.logger.history[0]


@pytest.fixture(scope="module")
def expected(golden, reward_model_dir, case):
    """The reference quantities of the rollout, from fresh copies of the models, row by row."""
    module, data, record, initial_policy, _ = golden
    policy = AutoModelForCausalLM.from_pretrained(case.trunk).eval()
    policy.load_state_dict(initial_policy)
    reference = AutoModelForCausalLM.from_pretrained(case.trunk).eval()  # the SFT model, untouched
    reward_model = AutoModelForSequenceClassification.from_pretrained(reward_model_dir, num_labels=1).eval()
    rows = ref.unpadded_rows(data.prompts["input_ids"], data.prompts["attention_mask"], RESPONSES, {EOS})
    out = {
        k: [] for k in ("logprobs", "ref_logprobs", "values", "raw_scores", "scores", "kl", "rewards", "adv", "returns")
    }
    beta = record["kl_coef_at_rollout"]
    assert beta == BETA
    with torch.no_grad():
        for prompt, response, ended in rows:
            logprobs, _ = ref.response_logprobs_and_entropy(policy, prompt, response, TEMPERATURE)
            ref_logprobs, _ = ref.response_logprobs_and_entropy(reference, prompt, response, TEMPERATURE)
            values = [float(v) for v in ref.token_values(reward_model, prompt, response, REWARD_OFFSET)]
            raw = ref.reward_score(reward_model, prompt, response, REWARD_OFFSET)
            score = raw - SCORE_BIAS if ended else MISSING_EOS  # the penalty replaces the score
            kl = [float(a) - float(b) for a, b in zip(logprobs, ref_logprobs)]
            rewards = [-beta * k for k in kl]
            rewards[-1] += score  # the score lands on the last response token (its EOS when it ended)
            adv, returns = ref.gae_row(rewards, values, PPO.gamma, PPO.lam)
            for key, value in zip(
                out,
                (
                    [float(x) for x in logprobs],
                    [float(x) for x in ref_logprobs],
                    values,
                    raw,
                    score,
                    kl,
                    rewards,
                    adv,
                    returns,
                ),
            ):
                out[key].append(value)
    out["adv"] = ref.whiten_all(out["adv"])
    out["rows"] = rows
    return out


@pytest.fixture(scope="module")
def rollout_bounds(golden, expected, case) -> dict[str, float]:
    """:func:`golden_bounds.rollout_bounds` at the rollout's models (the perturbed policy, the SFT reference)."""
    _, _, record, initial_policy, _ = golden
    policy = AutoModelForCausalLM.from_pretrained(case.trunk).eval()
    policy.load_state_dict(initial_policy)
    reference = AutoModelForCausalLM.from_pretrained(case.trunk).eval()
    return golden_bounds.rollout_bounds(policy, reference, record["rollouts"][0], expected, BETA, PPO, TEMPERATURE)


def _on_mask(tensor: torch.Tensor, rows) -> list[list[float]]:
    return [tensor[i, : len(response)].tolist() for i, (_, response, _) in enumerate(rows)]


def _close(actual, wanted, bound: float, what=""):
    """Every value within ``bound`` (absolute, derived in golden_bounds.py)."""
    torch.testing.assert_close(
        torch.tensor(actual, dtype=torch.float64),
        torch.tensor(wanted, dtype=torch.float64),
        rtol=0,
        atol=bound,
        msg=lambda m: f"{what}: {m}",
    )


def _flat(rows: list[list[float]]) -> list[float]:
    return [x for row in rows for x in row]


def test_rollout_masks_follow_the_first_eos(golden, expected):
    rollout = golden[2]["rollouts"][0]
    lengths = [len(r) for _, r, _ in expected["rows"]]
    assert lengths == [3, 6, 1, 6]
    assert rollout.response_mask.tolist() == [[t < n for t in range(6)] for n in lengths]
    assert rollout.ended.tolist() == [True, False, True, True]
    assert rollout.response_ids[0, 3:].tolist() == [PAD] * 3 and rollout.response_ids[2, 1:].tolist() == [PAD] * 5


@pytest.mark.parametrize(
    "field,key",
    [
        ("old_logprobs", "logprobs"),
        ("ref_logprobs", "ref_logprobs"),
        ("old_values", "values"),
        ("kl", "kl"),
        ("rewards", "rewards"),
        ("advantages", "adv"),
        ("returns", "returns"),
    ],
)
def test_rollout_tensor_matches_the_loop_reference(golden, expected, rollout_bounds, field, key):
    rollout = golden[2]["rollouts"][0]
    tensor = getattr(rollout, field)
    _close(_flat(_on_mask(tensor, expected["rows"])), _flat(expected[key]), rollout_bounds[key], what=field)
    if field in ("kl", "rewards", "advantages"):  # documented: 0 off the response mask
        assert (tensor[~rollout.response_mask] == 0).all(), field


def test_rollout_scores_and_kl_are_not_trivial(golden, expected, rollout_bounds):
    rollout = golden[2]["rollouts"][0]
    _close(rollout.raw_scores.tolist(), expected["raw_scores"], rollout_bounds["raw_scores"], what="raw_scores")
    _close(rollout.scores.tolist(), expected["scores"], rollout_bounds["scores"], what="scores")
    # The setup is not degenerate: KL, values and advantages are far from 0 and from each other.
    assert min(abs(k) for k in _flat(expected["kl"])) > 1e-3
    assert min(abs(v) for v in _flat(expected["values"])) > 1e-3
    assert len({round(a, 4) for a in _flat(expected["adv"])}) == 16


def test_controller_gets_the_summed_kl_per_response_and_the_sample_count(golden, expected, rollout_bounds, case):
    module, _, _, _, metrics = golden
    kl_per_response = [sum(row) for row in expected["kl"]]
    kl_mean = sum(kl_per_response) / 4
    longest = max(len(row) for row in expected["kl"])  # a response's KL sums at most this many tokens
    _close(metrics["objective/kl"], kl_mean, longest * rollout_bounds["kl"], what="objective/kl")
    # Ziegler et al. eq. 2: the case's KL target, horizon 100, 4 samples (1 rank); the error must be unclipped.
    error = kl_mean / case.kl_target - 1.0
    assert 0.02 < error < 0.2  # inside the clip, so the value depends on the KL fed in
    assert module.kl_ctl.value == pytest.approx(BETA * (1 + error * 4 / 100), rel=1e-6)


def _minibatch_rows(golden) -> list[int]:
    rollout = golden[2]["rollouts"][0]
    rows = []
    for ids, _, _ in golden[2]["minibatches"]:
        # A minibatch may drop left-padding columns that none of its rows attends (rollout.drop_columns).
        dropped = rollout.query_responses.shape[1] - ids.shape[1]
        (match,) = [i for i in range(4) if torch.equal(rollout.query_responses[i, dropped:], ids[0])]
        assert not rollout.attention_mask[match, :dropped].any()
        rows.append(match)
    return rows


def _models_at(step_params: dict[str, tuple[torch.Tensor, torch.Tensor]], auto_class, path, prefix: str):
    model = auto_class.from_pretrained(
        path, **({"num_labels": 1} if auto_class is AutoModelForSequenceClassification else {})
    )
    state = {name[len(prefix) :]: value for name, (value, _) in step_params.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("lm_head" in k for k in missing), (missing, unexpected)
    return model.eval()


def test_each_step_gradient_and_minibatch_losses_match_the_reference(
    golden, expected, reward_model_dir, rollout_bounds, case
):
    module, data, record, _, _ = golden
    rows = _minibatch_rows(golden)
    assert sorted(rows[:4]) == sorted(rows[4:]) == [0, 1, 2, 3]  # each epoch sees every row once
    assert len(data.drawn) == 8  # one ptx batch per minibatch, cycling the 3
    policy_steps = [p for which, p in record["steps"] if which == "policy"]
    critic_steps = [p for which, p in record["steps"] if which == "critic"]
    assert len(policy_steps) == len(critic_steps) == 4  # 2 epochs x 4 minibatches / grad_accum 2
    for step in range(4):
        policy = _models_at(policy_steps[step], AutoModelForCausalLM, case.trunk, "")
        critic = _models_at(
            {k[len("model.") :]: v for k, v in critic_steps[step].items()},
            AutoModelForSequenceClassification,
            reward_model_dir,
            "",
        )
        total = 0.0
        moves = []  # per minibatch: how far its loss weights may move the policy's and critic's gradients
        for j in (2 * step, 2 * step + 1):
            loss, parts, per_token = ref.minibatch_losses(
                policy, critic, rows[j], data.drawn[j], expected, PPO, TEMPERATURE, REWARD_OFFSET
            )
            _, recorded_loss, stats = record["minibatches"][j]
            # The stage applies the LM head to the response positions only and drops the padding
            # columns none of the minibatch's rows attends: other summation orders than this per-row
            # loop, within the derived bounds (planted bugs move these by 1e-2 and more).
            rollout = golden[2]["rollouts"][0]
            limits = golden_bounds.loss_bounds(
                policy, rollout, data.drawn[j], per_token, rollout_bounds, PPO, TEMPERATURE, REWARD_OFFSET
            )
            _close(recorded_loss, float(loss.detach()), limits["loss"], what=f"minibatch {j} loss")
            for name, value in parts.items():
                _close(stats[name], float(value.detach()), limits[name], what=f"minibatch {j} {name}")
            moves.append(
                golden_bounds.weight_errors(
                    policy, critic, per_token, rollout_bounds, limits["d_log_ratio"], limits["d_value"], PPO
                )
            )
            total = total + loss / PPO.grad_accum
        total.backward()
        grads = {n: p.grad for n, p in policy.named_parameters() if p.grad is not None}
        got = {n: g for n, (_, g) in policy_steps[step].items()}
        positions = 2 * golden_bounds.positions_of(golden[2]["rollouts"][0])  # the step's two one-row minibatches
        policy_moves = {n: moves[0][0][n] + moves[1][0][n] for n in grads}
        golden_bounds.assert_grads_close(got, grads, policy_moves, policy.config, positions, f"policy step {step}")
        critic_grads = {"model." + n: p.grad for n, p in critic.named_parameters() if p.grad is not None}
        critic_moves = {"model." + n: moves[0][1][n] + moves[1][1][n] for n in moves[0][1]}
        got = {n: g for n, (_, g) in critic_steps[step].items()}
        golden_bounds.assert_grads_close(
            got, critic_grads, critic_moves, policy.config, positions, f"critic step {step}"
        )


def test_the_passes_ran_as_configured_with_one_graph_per_shape_and_grad_mode(golden):
    module, _, _, _, metrics = golden
    stats = module.forward_passes.stats
    if module.ppo.forward == "eager":
        assert (stats.graphs, stats.calls) == (0, 0) and "compile/forward_graphs" not in metrics
        return
    # Scoring: the 3 rows the first (1-row) minibatch's forward does not score, without grad; the update:
    # 1-row minibatches with grad, whose dropped padding changes their length (1 to 6 prompt columns,
    # 6 response columns) inside one bucket (16 + 16).
    assert stats.graphs == 2 and stats.calls == 1 + 8
    assert metrics["compile/forward_graphs"] == 2 and metrics["compile/forward_s"] > 0

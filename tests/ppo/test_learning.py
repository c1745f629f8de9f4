"""PPO learns: the KL-shaped objective it maximises rises, over more than one seed, and the KL stays bounded.

Two setups. The first is the original learning check (its own settings, below). The second guards
what the demo's PPO study found (docs/DEMO.md, "PPO that climbs its own objective"): with the
demo config's update settings and reward reading, the shaped objective rises at a good exchange
rate for the score, and a reward model that scores cut responses lower is not exploited by ending
responses early.

The reward counts a chosen token ("."), the KL coefficient is fixed, and one on-policy update is
taken per rollout of 16 prompts. What PPO promises is ascent of the shaped objective
``score - beta * KL`` (``objective/rlhf_reward``), not of the score alone: the score can rise
while the objective falls (noise-driven drift costs KL). Measured over seeds 0-4 (on AVX-512 and
on the portable kernels, ATEN_CPU_CAPABILITY=default): the objective rose by 0.38-0.57 from the
first 10 to the last 10 of 40 rollouts, the score from ~0.8 to 1.4-1.75 dots per response, and
the KL per response peaked at 3.4-7.2 nats. The assertions keep a margin of 2-3x on each.
"""

from __future__ import annotations

import pytest
import yaml
from assets_paths import CONFIGS
from learning_helpers import ROLLOUTS, CountingPPO, fit_curves, learning_curves, mean_of
from ppo_helpers import EOS, EosBias, tiny_module

from rlhf_lit.models.generation import SamplingConfig
from rlhf_lit.stages.optim import OptimizerConfig
from rlhf_lit.stages.ppo.config import KLConfig, PPOConfig, RewardConfig


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_shaped_objective_rises_while_kl_stays_bounded(tmp_path, seed):
    module = tiny_module(
        sampling=SamplingConfig(max_new_tokens=16),
        ppo=PPOConfig(epochs=1, minibatch_size=16, vf_coef=0.1),
        kl=KLConfig(kind="fixed", init_coef=0.05),
        optimizer=OptimizerConfig(lr=1e-4, eps=1e-5),
        max_rollouts=ROLLOUTS,
        rollout_seed=seed,
    )
    objective, scores, kls = learning_curves(module, tmp_path, seed)
    print("objective", [round(s, 2) for s in objective], "kl", [round(k, 2) for k in kls])
    # The shaped objective (score + the KL part, each rollout's own beta) rises: measured +0.38..+0.57.
    assert mean_of(objective[-10:]) > mean_of(objective[:10]) + 0.15
    assert mean_of(scores[-10:]) > mean_of(scores[:10]) + 0.2  # through the reward, measured +0.5..+0.9
    # The penalty holds the KL: measured at most 7.2 nats per response over 16 tokens.
    assert max(kls) < 20.0


# ---------------------------------------------------------------- the demo's update settings
DEMO_PPO = CONFIGS / "demo" / "ppo.yaml"
DEMO_ROLLOUTS = 20


class CutPenaltyPPO(CountingPPO):
    """The count of ``target`` minus 1 when the reward model reads a response that does not end at
    EOS: the demo RM's artifact (it scored cut responses 0.45 std lower than the same text ending
    with EOS), on a reward the policy can learn."""

    def score(self, query_responses, attention_mask):
        last = attention_mask.shape[1] - 1 - attention_mask.flip(1).argmax(1)  # (B,) last attended position
        read_at_eos = query_responses.gather(1, last[:, None]).squeeze(1) == EOS  # (B,)
        return super().score(query_responses, attention_mask) - (~read_at_eos).float()  # (B,)


def demo_settings() -> dict:
    """The update settings and reward reading of ``configs/demo/ppo.yaml``, as a run of it gets them."""
    init = yaml.safe_load(DEMO_PPO.read_text())["model"]["init_args"]
    return {
        "ppo": PPOConfig(**init["ppo"]),
        "kl": KLConfig(**init["kl"]),
        "optimizer": OptimizerConfig(**init["optimizer"]),
        "reward": RewardConfig(**init["reward"]),
    }


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_the_demo_settings_climb_the_shaped_objective_without_ending_early(tmp_path, seed):
    # stories260K with its EOS logit raised, so about a third of 16-token responses end (reference too).
    module = tiny_module(
        sampling=SamplingConfig(max_new_tokens=16), max_rollouts=DEMO_ROLLOUTS, rollout_seed=seed, **demo_settings()
    )
    for model in (module.policy, module.ref_policy):
        model.lm_head = EosBias(model.lm_head, 20.0)
    module.on_fit_end = lambda: None  # no export: the wrapped head is not a transformers module
    objective, scores, ended = fit_curves(
        module,
        tmp_path,
        seed,
        kind=CutPenaltyPPO,
        records=512,
        batch_size=64,
        rollouts=DEMO_ROLLOUTS,
        tags=("objective/rlhf_reward", "objective/scores", "response/ended_fraction"),
    )
    print("objective", [round(v, 2) for v in objective], "ended", [round(v, 2) for v in ended])
    rise = mean_of(objective[-5:]) - mean_of(objective[:5])
    gain = mean_of(scores[-5:]) - mean_of(scores[:5])
    # Measured over 20 rollouts (seeds 0, 1, 2): objective +0.16 / +0.14 / +0.12 for a score gain of
    # +0.25 / +0.26 / +0.24 (ratio 0.64 / 0.54 / 0.49), ended 0.23 -> 0.20 / 0.25 -> 0.22 / 0.23 -> 0.25;
    # over 30: objective +0.20 / +0.16, score +0.30 / +0.32, ended 0.23 -> 0.17 / 0.25 -> 0.15.
    # The demo's earlier settings (lr 1e-4, 4 epochs, cut responses read as sampled): objective
    # +0.14 / +0.10 for a score gain of +0.74 / +0.63, ended 0.34 -> 0.78 / 0.33 -> 0.82; lr 1e-4
    # and 4 epochs alone: objective +0.04 for +0.54 (seed 0); as_sampled alone: ended 0.36 -> 0.68.
    assert rise > 0.08  # PPO ascends what it maximises ...
    assert rise > 0.35 * gain  # ... and pays at most 65% of the score it gains in KL
    assert (
        mean_of(ended[-5:]) < mean_of(ended[:5]) + 0.1
    )  # ending early earns nothing when cut responses are read at EOS

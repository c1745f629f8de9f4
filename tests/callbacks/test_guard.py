"""The guard's decisions on a stand-in trainer and PPO module fed constructed rollout metrics: when a
signal acts (patience, once, again after it stopped holding), ``stop``, ``keep_best``'s choice of
policy, the held-out evaluation's bookkeeping and the state a resume restores."""

from __future__ import annotations

import io
import logging
from types import SimpleNamespace

import pytest
import torch

from rlhf_lit.callbacks.guard import KeepBest, KLSignal, ObjectiveSignal, OverOptimisationGuard


class Logger:
    """Records what the guard logs: metrics by step, text entries."""

    def __init__(self) -> None:
        self.metrics: dict[int, dict[str, float]] = {}
        self.texts: list[tuple[str, str, int]] = []
        self.experiment = SimpleNamespace(add_text=self.add_text)

    def add_text(self, tag: str, text: str, global_step: int) -> None:
        self.texts.append((tag, text, global_step))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.metrics.setdefault(step, {}).update(metrics)


def _trainer() -> SimpleNamespace:
    return SimpleNamespace(
        should_stop=False,
        is_global_zero=True,
        loggers=[Logger()],
        callbacks=[],
        strategy=SimpleNamespace(broadcast=lambda x: x),
    )


def _module() -> SimpleNamespace:
    policy = torch.nn.Linear(2, 1)
    with torch.no_grad():
        policy.weight.fill_(0.0)
        policy.bias.fill_(-1.0)
    return SimpleNamespace(rollout_index=0, max_rollouts=100, last_rollout_metrics={}, policy=policy)


def _feed(guard: OverOptimisationGuard, trainer, module, rollouts: list[dict[str, float]]) -> None:
    """Each rollout as PPO makes it: the policy samples, is updated (its weight becomes the number of
    updates it had), the counter moves, the metrics are the rollout's."""
    for metrics in rollouts:
        guard.on_train_batch_start(trainer, module, None, 0)
        with torch.no_grad():
            module.policy.weight.add_(1.0)
        module.rollout_index += 1
        module.last_rollout_metrics = metrics
        guard.on_train_batch_end(trainer, module, None, None, 0)


def test_a_signal_acts_after_patience_once_then_again_after_it_stopped_holding(caplog):
    guard = OverOptimisationGuard(kl=KLSignal(action="warn", ceiling=1.0, patience=2))
    trainer, module = _trainer(), _module()
    kl = [0.0, 2.0, 2.0, 2.0, 0.0, 2.0, 2.0]  # holds after rollouts 2, 3, 4, 6, 7
    with caplog.at_level(logging.WARNING, "rlhf_lit"):
        _feed(guard, trainer, module, [{"objective/kl": v} for v in kl])
    logged = trainer.loggers[0].metrics
    assert [logged[step]["guard/kl/acted"] for step in range(7)] == [0, 0, 1, 0, 0, 0, 1]
    assert [logged[step]["guard/kl/holds"] for step in range(7)] == [0, 1, 1, 1, 0, 1, 1]
    lines = [r.getMessage() for r in caplog.records if "guard" in r.getMessage()]
    assert lines == [
        "over-optimisation guard: kl after rollout 3: KL per response 2 > ceiling 1; action: warn",
        "over-optimisation guard: kl after rollout 7: KL per response 2 > ceiling 1; action: warn",
    ]
    assert [(tag, step) for tag, _, step in trainer.loggers[0].texts] == [("guard", 2), ("guard", 6)]
    assert not trainer.should_stop


def test_stop_ends_the_run_after_the_rollout_it_acts_on():
    guard = OverOptimisationGuard(kl=KLSignal(action="stop", ceiling=1.0, patience=3))
    trainer, module = _trainer(), _module()
    _feed(guard, trainer, module, [{"objective/kl": 2.0}] * 2)
    assert not trainer.should_stop
    _feed(guard, trainer, module, [{"objective/kl": 2.0}])
    assert trainer.should_stop and guard.stopped_at == 3


def test_keep_best_exports_the_policy_that_sampled_the_best_rollout():
    guard = OverOptimisationGuard(
        kl=KLSignal(action="keep_best", ceiling=-1.0), keep_best=KeepBest(metric="objective/scores")
    )
    trainer, module = _trainer(), _module()
    scores = [0.1, 0.5, 0.3, 0.2]  # the best: rollout 2, sampled by the policy after 1 update
    _feed(guard, trainer, module, [{"objective/kl": 0.0, "objective/scores": s} for s in scores])
    assert guard.best == (1, 0.5) and module.policy.weight.flatten().tolist() == [4.0, 4.0]
    guard.on_fit_end(trainer, module)
    assert module.policy.weight.flatten().tolist() == [1.0, 1.0]
    assert trainer.loggers[0].metrics[3]["guard/best/rollout"] == 1.0


def test_keep_best_without_a_value_of_its_metric_exports_the_last_and_says_so(caplog):
    guard = OverOptimisationGuard(
        kl=KLSignal(action="keep_best", ceiling=-1.0), keep_best=KeepBest(metric="objective/judge")
    )  # a run without a judge
    trainer, module = _trainer(), _module()
    _feed(guard, trainer, module, [{"objective/kl": 0.0, "objective/scores": 1.0}] * 2)
    with caplog.at_level(logging.WARNING, "rlhf_lit"):
        guard.on_fit_end(trainer, module)
    assert module.policy.weight.flatten().tolist() == [2.0, 2.0]
    assert caplog.records[-1].getMessage() == (
        "over-optimisation guard: keep_best acted but no policy had a value "
        "of objective/judge: exporting the last policy"
    )


def test_keep_best_changes_nothing_unless_a_keep_best_signal_fired():
    guard = OverOptimisationGuard(
        kl=KLSignal(action="keep_best", ceiling=10.0), keep_best=KeepBest(metric="objective/scores")
    )
    trainer, module = _trainer(), _module()
    _feed(guard, trainer, module, [{"objective/kl": 0.0, "objective/scores": s} for s in (0.5, 0.1, 0.1)])
    guard.on_fit_end(trainer, module)
    assert module.policy.weight.flatten().tolist() == [3.0, 3.0]  # the last policy


def test_held_out_keep_best_judges_the_policy_after_the_evaluated_rollout(monkeypatch):
    from rlhf_lit.callbacks.guard import HeldOut

    guard = OverOptimisationGuard(
        kl=KLSignal(action="keep_best", ceiling=-1.0),
        held_out=HeldOut(prompts=["a"], every_n_rollouts=2),
        keep_best=KeepBest(metric="guard/held_out/score"),
    )
    # the evaluation's RM score: the policy's weight (its number of updates) times -1 after 4 updates
    monkeypatch.setattr(guard.sampler, "sample", lambda m: ([""], {"score": [m.policy.weight[0, 0].item() % 4]}))
    trainer, module = _trainer(), _module()
    _feed(guard, trainer, module, [{"objective/kl": 0.0}] * 6)
    assert [(e.rollouts, e.score) for e in guard.evaluations] == [(2, 2.0), (4, 0.0), (6, 2.0)]
    assert guard.best == (2, 2.0)  # after 2 rollouts; the tie at 6 keeps the earlier
    guard.on_fit_end(trainer, module)
    assert module.policy.weight.flatten().tolist() == [2.0, 2.0]


def test_the_held_out_sampler_takes_every_held_out_setting():
    from rlhf_lit.callbacks.guard import HeldOut
    from rlhf_lit.models.generation import SamplingConfig

    sampling = SamplingConfig(max_new_tokens=5)
    judge = "rlhf_lit.evaluation.judges:vader"
    settings = dict(prompts=["a", "b"], every_n_rollouts=3, judge=judge, seed=7, sampling=sampling)
    held_out = HeldOut(**settings, chat_template="never", judge_reads="query_response")
    sampler = OverOptimisationGuard(held_out=held_out).sampler
    assert (sampler.prompts, sampler.every_n_rollouts, sampler.seed, sampler.sampling) == (["a", "b"], 3, 7, sampling)
    assert (sampler.chat_template, sampler.judge_reads, sampler.judge.spec) == ("never", "query_response", judge)


@pytest.mark.parametrize("split", [2, 3, 5])
def test_the_state_resumes_exactly(split):
    def guard() -> OverOptimisationGuard:
        return OverOptimisationGuard(
            kl=KLSignal(action="keep_best", ceiling=1.0, patience=2),
            objective=ObjectiveSignal(action="warn", window=3, patience=1),
            keep_best=KeepBest(metric="objective/scores"),
        )

    rollouts = [
        {"objective/kl": k, "objective/scores": s, "objective/rlhf_reward": r}
        for k, s, r in zip(
            [0, 2, 2, 0, 2, 2, 2], [0.1, 0.9, 0.3, 0.4, 0.5, 0.2, 0.6], [1.0, 0.9, 0.7, 0.6, 0.8, 0.7, 0.6]
        )
    ]
    straight, trainer, module = guard(), _trainer(), _module()
    _feed(straight, trainer, module, rollouts)

    first, resumed_trainer, resumed_module = guard(), _trainer(), _module()
    _feed(first, resumed_trainer, resumed_module, rollouts[:split])
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)  # through a file, as in a checkpoint
    buffer.seek(0)
    resumed = guard()
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    _feed(resumed, resumed_trainer, resumed_module, rollouts[split:])

    assert {k: v for k, v in resumed_trainer.loggers[0].metrics.items()} == trainer.loggers[0].metrics
    a, b = straight.state_dict(), resumed.state_dict()
    assert a.pop("best_weights").keys() == b["best_weights"].keys()
    assert all(torch.equal(straight.best_weights[k], v) for k, v in b.pop("best_weights").items())
    assert a == b and a["best"] == (1, 0.9) and a["keep_best_from"] == 3


def test_a_run_without_the_metric_gets_one_warning_and_no_alarm(caplog):
    from rlhf_lit.callbacks.guard import DisagreementSignal

    guard = OverOptimisationGuard(disagreement=DisagreementSignal(action="stop", baseline=1, window=1, patience=1))
    trainer, module = _trainer(), _module()
    with caplog.at_level(logging.WARNING, "rlhf_lit"):
        _feed(guard, trainer, module, [{"objective/kl": 0.0, "objective/scores": 0.0}] * 4)
    assert not trainer.should_stop
    assert [r.getMessage() for r in caplog.records] == [
        "over-optimisation guard: disagreement is not available: this run does not log reward/reward_model/std"
    ]


def test_a_skipped_rollout_is_no_evidence_of_a_missing_metric(caplog):
    from rlhf_lit.callbacks.guard import LengthSignal

    guard = OverOptimisationGuard(length=LengthSignal(action="warn"))
    trainer, module = _trainer(), _module()
    with caplog.at_level(logging.WARNING, "rlhf_lit"):  # a non-finite rollout logs only its skip
        _feed(guard, trainer, module, [{"skipped/nonfinite_rollout": 1.0}])
        _feed(guard, trainer, module, [{"objective/scores": 0.0, "response/length": 9.0}])
    assert not caplog.records and guard.history["response/length"] == [None, 9.0]


def test_a_signal_the_run_cannot_produce_is_refused_before_training():
    guard = OverOptimisationGuard(proxy_gold={"action": "warn", "source": "rollout"})
    trainer = _trainer()
    trainer.callbacks, trainer.strategy = [guard], SimpleNamespace()
    module = _module()
    module.judge = None
    with pytest.raises(ValueError, match=r"proxy_gold \(source: rollout\) reads objective/judge"):
        guard.on_fit_start(trainer, module)
    module.judge = len  # any judge: the run logs objective/judge
    guard.on_fit_start(trainer, module)


def _refused_at_fit_start(guard, trainer=None, module=None) -> str:
    trainer = trainer or _trainer()
    trainer.callbacks = trainer.callbacks or [guard]
    module = module or _module()
    module.judge = None
    with pytest.raises(ValueError) as refused:
        guard.on_fit_start(trainer, module)
    return str(refused.value)


def test_a_strategy_order_or_reward_source_the_guard_cannot_serve_is_refused_before_training():
    from lightning.pytorch.strategies import ModelParallelStrategy

    from rlhf_lit.callbacks import Preemption
    from rlhf_lit.callbacks.guard import DisagreementSignal

    keeps = OverOptimisationGuard(kl=KLSignal(action="keep_best", ceiling=1.0), keep_best=KeepBest("objective/scores"))
    sharded = _trainer()
    sharded.strategy = ModelParallelStrategy.__new__(ModelParallelStrategy)  # fsdp2's base class
    assert "single-device and ddp runs only, not fsdp" in _refused_at_fit_start(keeps, sharded)
    late = _trainer()
    late.callbacks = [Preemption(["rlhf-lit"]), keeps]
    assert "list OverOptimisationGuard before Preemption" in _refused_at_fit_start(keeps, late)
    no_rm = _module()
    no_rm.reward_cfg = SimpleNamespace(uses_reward_model=False)
    ensemble = OverOptimisationGuard(disagreement=DisagreementSignal(action="warn"))
    assert "reads reward/reward_model/std, but this run has no reward model source" in _refused_at_fit_start(
        ensemble, module=no_rm
    )
    with pytest.raises(ValueError, match="PPO runs"):
        ensemble.on_fit_start(_trainer(), SimpleNamespace())  # an SFT module: no rollout counter


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kl": KLSignal(action="keep_best", ceiling=1.0)}, "keep_best.metric guard/held_out/judge needs held_out"),
        (
            {
                "kl": KLSignal(action="keep_best", ceiling=1.0),
                "held_out": {"prompts": ["a"]},
                "keep_best": {"metric": "guard/held_out/jugde"},
            },
            "the held-out evaluation logs guard/held_out/score and",
        ),
        (
            {"proxy_gold": {"action": "warn"}},
            r"proxy_gold \(source: held_out\) needs held_out with prompts and a judge",
        ),
    ],
)
def test_settings_that_read_a_missing_evaluation_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        OverOptimisationGuard(**kwargs)

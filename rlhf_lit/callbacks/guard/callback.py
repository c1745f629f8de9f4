"""``OverOptimisationGuard``: the callback that reads each PPO rollout's metrics, applies the guard's
rules and acts (warn, stop, keep the best policy); its decisions are logged and checkpointed.

Where: at the end of every rollout (``on_train_batch_end`` after the rollout counter moved), on
every process, from the module's ``last_rollout_metrics`` (already averaged over ranks) and the
held-out evaluation (rank 0's numbers broadcast), so every process takes the same decision and a
``stop`` ends all of them at the same rollout. Lightning runs checkpoint callbacks after the other
callbacks, and rlhf-lit adds :class:`~rlhf_lit.callbacks.Preemption` after the config's, so the
rollout's checkpoint holds the guard's state with that rollout in it.
"""

from __future__ import annotations

import logging
from dataclasses import fields
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

from rlhf_lit.callbacks.guard.policy_copy import copy_weights, restore_weights
from rlhf_lit.callbacks.guard.signals import (
    HELD_OUT_JUDGE,
    HELD_OUT_SCORE,
    Action,
    DisagreementSignal,
    DistinctSignal,
    Evaluation,
    HeldOut,
    KeepBest,
    KLSignal,
    LengthSignal,
    ObjectiveSignal,
    ProxyGoldSignal,
)
from rlhf_lit.callbacks.guard.verdicts import Verdict, persistent
from rlhf_lit.callbacks.online_generation import OnlineGeneration, log_to_loggers
from rlhf_lit.callbacks.preemption import Preemption
from rlhf_lit.option_values import check_least
from rlhf_lit.stages.base import as_config

log = logging.getLogger(__name__)

SIGNALS: tuple[str, ...] = ("proxy_gold", "disagreement", "kl", "length", "distinct", "objective")
"""The guard's signals, in the order they are evaluated (and named in ``guard/<signal>/*``)."""
STATE_VERSION = 1
RESTORED = ("rollouts", "stopped_at", "keep_best_from", "best_weights")
"""The parts of the guard's state a resume restores as they were saved (the others are rebuilt or merged)."""


PREFIX = "over-optimisation guard: "
"""What every line of the guard starts with."""


def _warn(trainer: Trainer, message: str, *args: Any) -> None:
    """One warning line of the guard, on rank 0 (every rank takes the same decision)."""
    if trainer.is_global_zero:
        log.warning(PREFIX + message, *args)


class OverOptimisationGuard(Callback):
    """Watch a PPO run for over-optimisation (reward hacking) and warn, stop, or keep the best policy.

    Each signal is off until given an ``action``; its rule and thresholds are its dataclass's
    (:mod:`~rlhf_lit.callbacks.guard.signals`, docs/monitoring.md). A signal acts when its rule
    has held ``patience`` evaluations in a row, once, and again only after the rule stopped holding.

    Args:
        proxy_gold: the RM score rising while a judge stalls (:class:`ProxyGoldSignal`).
        disagreement: the reward-model ensemble's disagreement rising (:class:`DisagreementSignal`).
        kl: the KL per response above a ceiling or growing fast (:class:`KLSignal`).
        length: the response length drifting (:class:`LengthSignal`).
        distinct: distinct-2 collapsing (:class:`DistinctSignal`).
        objective: the shaped objective falling (:class:`ObjectiveSignal`).
        held_out: the held-out evaluation (:class:`HeldOut`); None: none.
        keep_best: the metric ``keep_best`` maximises (:class:`KeepBest`).
    """

    def __init__(
        self,
        proxy_gold: ProxyGoldSignal = ProxyGoldSignal(),
        disagreement: DisagreementSignal = DisagreementSignal(),
        kl: KLSignal = KLSignal(),
        length: LengthSignal = LengthSignal(),
        distinct: DistinctSignal = DistinctSignal(),
        objective: ObjectiveSignal = ObjectiveSignal(),
        held_out: HeldOut | None = None,
        keep_best: KeepBest = KeepBest(),
    ) -> None:
        self.proxy_gold = as_config(ProxyGoldSignal, proxy_gold)
        self.disagreement = as_config(DisagreementSignal, disagreement)
        self.kl = as_config(KLSignal, kl)
        self.length = as_config(LengthSignal, length)
        self.distinct = as_config(DistinctSignal, distinct)
        self.objective = as_config(ObjectiveSignal, objective)
        self.held_out = as_config(HeldOut, held_out)
        self.keep_best = as_config(KeepBest, keep_best)
        for name in SIGNALS:
            self.signal(name).check()
        self.sampler = self._held_out_sampler()  # loads the judge: a bad spec fails before any model
        self._check_sources()
        metric_signals = (self.disagreement, self.length, self.distinct, self.objective)  # each reads its `metric`
        tracked = {"objective/kl", "objective/scores", "objective/judge", *(s.metric for s in metric_signals)}
        if self.keeps_best and not self.keep_best.held_out:
            tracked |= {self.keep_best.metric} | ({self.keep_best.penalty_metric} - {None})
        # The state a resume restores (state_dict): everything below.
        self.history: dict[str, list[float | None]] = {m: [] for m in sorted(tracked)}
        self.evaluations: list[Evaluation] = []
        self.streaks = dict.fromkeys(SIGNALS, 0)
        self.active = dict.fromkeys(SIGNALS, False)
        self.rollouts = 0  # rollouts observed
        self.stopped_at: int | None = None
        self.keep_best_from: int | None = None  # rollouts when a keep_best signal first acted
        self.best: tuple[int, float] | None = None  # (policy after that many rollouts, its guarded value)
        self.best_weights: dict[str, torch.Tensor] | None = None
        self.unavailable: set[str] = set()  # signals already reported as not available
        self._candidate: dict[str, torch.Tensor] | None = None  # the policy before this rollout

    # ------------------------------------------------------------------ settings
    def signal(self, name: str):
        """The settings of signal ``name``."""
        return getattr(self, name)

    def action(self, name: str) -> Action | None:
        """The action of signal ``name`` (None: off)."""
        return self.signal(name).action

    @property
    def keeps_best(self) -> bool:
        """Whether any signal's action is ``keep_best`` (the guard then keeps the best policy)."""
        return any(self.action(name) == "keep_best" for name in SIGNALS)

    def _held_out_sampler(self) -> OnlineGeneration | None:
        if self.held_out is None:
            return None
        if not self.held_out.prompts:
            raise ValueError("guard held_out.prompts is empty: give the held-out prompts, or drop held_out")
        check_least("guard held_out.every_n_rollouts", self.held_out.every_n_rollouts, 1)
        # every HeldOut setting is the OnlineGeneration argument of its name
        return OnlineGeneration(**{f.name: getattr(self.held_out, f.name) for f in fields(HeldOut)})

    def _check_sources(self) -> None:
        """Refuse a signal or keep_best that reads a held-out evaluation the settings do not make."""
        judge = self.held_out is not None and self.held_out.judge is not None
        if self.proxy_gold.action is not None and self.proxy_gold.source == "held_out" and not judge:
            raise ValueError("guard proxy_gold (source: held_out) needs held_out with prompts and a judge")
        if self.keeps_best and self.keep_best.held_out:
            if self.keep_best.metric not in (HELD_OUT_SCORE, HELD_OUT_JUDGE):
                raise ValueError(
                    f"guard keep_best.metric {self.keep_best.metric}: the held-out evaluation logs "
                    f"{HELD_OUT_SCORE} and {HELD_OUT_JUDGE} only"
                )
            if self.held_out is None or (self.keep_best.metric == HELD_OUT_JUDGE and not judge):
                raise ValueError(
                    f"guard keep_best.metric {self.keep_best.metric} needs held_out"
                    + (" with a judge" if self.keep_best.metric == HELD_OUT_JUDGE else "")
                )

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Read the held-out prompts when fit starts (a bad source is refused before any rollout)."""
        if self.sampler is not None:
            self.sampler.setup(trainer, pl_module, stage)

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Refuse, before any rollout, a module or strategy the guard cannot watch or act on."""
        if not isinstance(getattr(pl_module, "rollout_index", None), int):
            raise ValueError("OverOptimisationGuard watches PPO runs (rlhf_lit.stages.PPOModule) only")
        if self.keeps_best and isinstance(trainer.strategy, (FSDPStrategy, ModelParallelStrategy)):
            raise ValueError("guard keep_best copies the whole policy: single-device and ddp runs only, not fsdp")
        callbacks = trainer.callbacks
        preemption = [i for i, c in enumerate(callbacks) if isinstance(c, Preemption)]
        if preemption and preemption[0] < callbacks.index(self):
            raise ValueError(
                "list OverOptimisationGuard before Preemption in trainer.callbacks (a preemption "
                "checkpoint must hold the guard's state of the rollout it stops after)"
            )
        no_judge = getattr(pl_module, "judge", None) is None
        if self.proxy_gold.action is not None and self.proxy_gold.source == "rollout" and no_judge:
            raise ValueError(
                "guard proxy_gold (source: rollout) reads objective/judge: set the model's judge "
                "(model.init_args.judge), or use source: held_out"
            )
        reward_cfg = getattr(pl_module, "reward_cfg", None)
        if (
            self.disagreement.action is not None
            and self.disagreement.metric.startswith("reward/reward_model/")
            and reward_cfg is not None
            and not reward_cfg.uses_reward_model
        ):
            raise ValueError(
                f"guard disagreement reads {self.disagreement.metric}, but this run has no reward "
                "model source: set disagreement.metric to the ensemble's, or drop the action"
            )

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int) -> None:
        """Copy the policy that samples this rollout when ``keep_best`` judges it by a rollout metric."""
        if self.keeps_best and not self.keep_best.held_out and pl_module.rollout_index < pl_module.max_rollouts:
            self._candidate = copy_weights(pl_module.policy)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        """After a rollout (the counter moved; PPO's last no-op step is skipped): observe and act."""
        if pl_module.rollout_index != self.rollouts:
            self.observe(trainer, pl_module)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """With a ``keep_best`` signal fired, put the best policy back before the module exports
        (Lightning calls the callbacks' ``on_fit_end`` before the module's, which exports)."""
        if self.keep_best_from is None:
            return
        if self.best is None or self.best_weights is None:
            message = "keep_best acted but no policy had a value of %s: exporting the last policy"
            _warn(trainer, message, self.keep_best.metric)
            return
        kept, value = self.best
        if kept == self.rollouts:
            message = "the last policy (after rollout %d) is the best (%s = %.6g); exporting it"
            _warn(trainer, message, kept, self.keep_best.metric, value)
            return
        restore_weights(pl_module.policy, self.best_weights)
        message = "exporting the policy after rollout %d (the best: %s = %.6g), not the last (after rollout %d)"
        _warn(trainer, message, kept, self.keep_best.metric, value, self.rollouts)

    # ------------------------------------------------------------------ one rollout
    def observe(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Record the rollout's metrics, evaluate on the held-out prompts when due, track the best
        policy, apply every signal's rule and act; log it all as ``guard/*`` at the rollout's step."""
        n = pl_module.rollout_index
        metrics: dict[str, float] = dict(getattr(pl_module, "last_rollout_metrics", None) or {})
        for name, values in self.history.items():
            values.append(metrics.get(name))
        logged: dict[str, float] = {}
        evaluation = None
        if self.sampler is not None and n % self.held_out.every_n_rollouts == 0:
            evaluation = self._evaluate(trainer, pl_module, n)
            self.evaluations.append(evaluation)
            logged[HELD_OUT_SCORE] = evaluation.score
            if evaluation.judge is not None:
                logged[HELD_OUT_JUDGE] = evaluation.judge
        if self.keeps_best:
            self._track_best(pl_module, n, metrics, evaluation)
            if self.best is not None:
                logged["guard/best/rollout"], logged["guard/best/value"] = float(self.best[0]), self.best[1]
        texts = []
        for name in SIGNALS:
            if self.action(name) is not None:
                texts += self._apply(trainer, name, n, metrics, logged)
        self.rollouts = n
        log_to_loggers(trainer, n - 1, logged, "guard", "\n\n".join(texts))

    def _apply(self, trainer: Trainer, name: str, n: int, metrics: dict, logged: dict[str, float]) -> list[str]:
        """Signal ``name``'s verdict, streak and action for rollout ``n``; the lines it wrote."""
        verdict = self.signal(name).verdict(self.history, self.evaluations)
        if verdict is None:
            self._report_unavailable(trainer, name, metrics)
            self.streaks[name] = 0
            return []
        self.streaks[name] = persistent(self.streaks[name], verdict.holds)
        due = self.streaks[name] >= self.signal(name).patience
        acts = due and not self.active[name]
        self.active[name] = due
        logged.update(
            {
                f"guard/{name}/value": verdict.value,
                f"guard/{name}/threshold": verdict.threshold,
                f"guard/{name}/holds": float(verdict.holds),
                f"guard/{name}/acted": float(acts),
            }
        )
        return [self._act(trainer, name, n, verdict)] if acts else []

    def _act(self, trainer: Trainer, name: str, n: int, verdict: Verdict) -> str:
        """Take signal ``name``'s action; the line that says so (logged on rank 0)."""
        action = self.action(name)
        line = f"{name} after rollout {n}: {verdict.text}; action: {action}"
        if action == "stop":
            trainer.should_stop = True
            self.stopped_at = self.stopped_at or n
            line += " (the run ends after this rollout and exports as usual)"
        elif action == "keep_best":
            self.keep_best_from = self.keep_best_from or n
            line += f" (the export will be the policy with the best {self.keep_best.metric}, not the last)"
        _warn(trainer, "%s", line)
        return PREFIX + line

    def _report_unavailable(self, trainer: Trainer, name: str, metrics: dict) -> None:
        """Once per signal: a drift signal whose metric the run does not log (e.g. no ensemble)."""
        metric = getattr(self.signal(name), "metric", None)
        if metric is None or name in self.unavailable or metric in metrics or "objective/scores" not in metrics:
            return  # a skipped rollout (non-finite) logs no metrics: that says nothing about the run
        self.unavailable.add(name)
        _warn(trainer, "%s is not available: this run does not log %s", name, metric)

    def _evaluate(self, trainer: Trainer, pl_module: LightningModule, n: int) -> Evaluation:
        """The held-out evaluation of the policy now; rank 0's means, the same on every rank."""
        _, columns = self.sampler.sample(pl_module)
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        score, judge = mean(columns["score"]), (mean(columns["judge"]) if "judge" in columns else None)
        score, judge = trainer.strategy.broadcast((score, judge))
        return Evaluation(n, score, judge)

    def _track_best(self, pl_module: LightningModule, n: int, metrics: dict, evaluation: Evaluation | None) -> None:
        """Keep a CPU copy of the policy when its guarded value is the best so far (ties: the earlier)."""
        if self.keep_best.held_out:
            if evaluation is None:
                return
            held_out = {HELD_OUT_SCORE: evaluation.score, HELD_OUT_JUDGE: evaluation.judge}
            value = self.keep_best.value({**metrics, **held_out})
            policy_rollouts, weights = n, None  # copied below only when it is the best
        else:
            value = self.keep_best.value(metrics)
            policy_rollouts, weights = n - 1, self._candidate  # the policy that sampled rollout n - 1
        if value is None or (self.best is not None and value <= self.best[1]):
            return
        self.best = (policy_rollouts, float(value))
        self.best_weights = weights if weights is not None else copy_weights(pl_module.policy)

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue the guard exactly (in the Lightning checkpoint)."""
        kept = {name: getattr(self, name) for name in (*RESTORED, "history", "streaks", "active", "best")}
        evaluations = [(e.rollouts, e.score, e.judge) for e in self.evaluations]
        return {"version": STATE_VERSION, **kept, "evaluations": evaluations, "unavailable": sorted(self.unavailable)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s state."""
        for name in RESTORED:
            setattr(self, name, state_dict[name])
        for name in self.history:  # a metric this guard tracks that the saved one did not: unknown so far
            self.history[name] = list(state_dict["history"].get(name, [None] * self.rollouts))
        self.evaluations = [Evaluation(*e) for e in state_dict["evaluations"]]
        self.streaks.update(state_dict["streaks"])
        self.active.update(state_dict["active"])
        self.best = tuple(state_dict["best"]) if state_dict["best"] is not None else None
        self.unavailable = set(state_dict["unavailable"])

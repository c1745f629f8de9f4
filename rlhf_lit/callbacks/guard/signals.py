"""The guard's signals: one typed option set (a dataclass) per signal (its action, rule thresholds and patience),
the held-out evaluation and what ``keep_best`` keeps.

Every signal is off until it is given an ``action``. A signal's :meth:`verdict` is its rule
(:mod:`~rlhf_lit.callbacks.guard.verdicts`) applied to the run's history: pure, no Lightning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from rlhf_lit.callbacks.guard.verdicts import Direction, Verdict, above, drift, falling, proxy_without_gold, rate_above
from rlhf_lit.data.prompt_source import PromptSource, as_source, given_prompts
from rlhf_lit.data.rendering import TemplateOption, template_choice
from rlhf_lit.evaluation.judges import JudgeReads
from rlhf_lit.models.generation import SamplingConfig
from rlhf_lit.option_values import check_least

Action = Literal["warn", "stop", "keep_best"]
"""What a signal does when its rule has held ``patience`` evaluations in a row: ``warn`` (one log
line and a TensorBoard text entry), ``stop`` (end the run after this rollout; fit ends and exports
as usual) or ``keep_best`` (export the best policy of the run, :class:`KeepBest`, instead of the last)."""

History = Mapping[str, Sequence[float | None]]
"""Metric name -> its value at every rollout so far (``None`` where the rollout did not log it)."""

HELD_OUT_SCORE, HELD_OUT_JUDGE = "guard/held_out/score", "guard/held_out/judge"
"""The held-out evaluation's means: the reward model's score and the judge's (:class:`HeldOut`)."""


@dataclass(frozen=True)
class Evaluation:
    """One held-out evaluation: after ``rollouts`` rollouts, the mean RM score and judge score."""

    rollouts: int
    score: float
    judge: float | None


def _check_common(name: str, action: Action | None, patience: int, *windows: int, fitted: bool = False) -> None:
    """The settings every signal has; ``fitted``: the first window is a fitted line's (3 points at least)."""
    if action not in (None, "warn", "stop", "keep_best"):
        raise ValueError(f"guard {name}.action must be warn, stop or keep_best, got {action!r}")
    check_least(f"guard {name}.patience", patience, 1)
    if any(w < 1 for w in windows):
        raise ValueError(f"guard {name}: windows must be >= 1, got {list(windows)}")
    if fitted and windows[0] < 3:
        raise ValueError(f"guard {name}.window must be >= 3 (a fitted line), got {windows[0]}")


@dataclass
class ProxyGoldSignal:
    """The RM score rising while the held-out judge stalls or falls.

    Rule (:func:`~rlhf_lit.callbacks.guard.verdicts.proxy_without_gold`): over the last ``window``
    evaluations, the least-squares line of the RM score rises by >= ``min_proxy_rise`` while the
    judge's rises by <= ``max_gold_rise``. ``source``: ``held_out`` reads the guard's held-out
    evaluation (:class:`HeldOut`, with a judge; a window of evaluations, not rollouts), ``rollout``
    reads the rollout's ``objective/scores`` and ``objective/judge`` (``PPOModule(judge=...)``).
    """

    action: Action | None = None
    source: Literal["held_out", "rollout"] = "held_out"
    window: int = 4
    min_proxy_rise: float = 0.1
    max_gold_rise: float = 0.0
    patience: int = 1

    def check(self) -> None:
        """Refuse settings no run can use."""
        _check_common("proxy_gold", self.action, self.patience, self.window, fitted=True)

    def verdict(self, history: History, evaluations: Sequence[Evaluation]) -> Verdict | None:
        """The rule on the held-out evaluations or on the rollouts' scores and judge."""
        if self.source == "held_out":
            points = [(e.rollouts, e.score, e.judge) for e in evaluations if e.judge is not None]
        else:
            scores, judge = history.get("objective/scores", []), history.get("objective/judge", [])
            points = [(i, s, j) for i, (s, j) in enumerate(zip(scores, judge)) if s is not None and j is not None]
        if not points:
            return None
        rollouts, proxy, gold = zip(*points)
        return proxy_without_gold(rollouts, proxy, gold, self.window, self.min_proxy_rise, self.max_gold_rise)


@dataclass
class DriftSignal:
    """A metric drifting from its first rollouts (the baseline window).

    Rule (:func:`~rlhf_lit.callbacks.guard.verdicts.drift`): the mean of the last ``window`` rollouts
    minus the mean of the first ``baseline`` ones, counted ``direction``-wise, is larger than
    ``max(relative * |baseline mean|, absolute)``.
    """

    action: Action | None = None
    metric: str = ""
    direction: Direction = "up"
    baseline: int = 5
    window: int = 5
    relative: float = 0.5
    absolute: float = 0.0
    patience: int = 3
    name = "drift"

    def check(self) -> None:
        """Refuse settings no run can use."""
        _check_common(self.name, self.action, self.patience, self.baseline, self.window)
        if self.relative < 0 or self.absolute < 0:
            raise ValueError(f"guard {self.name}: relative and absolute must be >= 0")
        if self.action is not None and self.relative == 0 and self.absolute == 0:
            raise ValueError(f"guard {self.name}: relative or absolute must be > 0 (any change would fire)")

    def verdict(self, history: History, evaluations: Sequence[Evaluation] = ()) -> Verdict | None:
        """The drift rule on ``metric``'s history."""
        return drift(
            history.get(self.metric, []),
            self.baseline,
            self.window,
            self.direction,
            self.relative,
            self.absolute,
            self.metric,
        )


@dataclass
class DisagreementSignal(DriftSignal):
    """The reward-model ensemble's disagreement rising from its first rollouts: the mean member
    standard deviation the ensemble logs (``reward/<source>/std``). A run whose reward source is not
    an ensemble does not log it: the signal is not available there (one warning, never a firing)."""

    metric: str = "reward/reward_model/std"
    direction: Direction = "up"
    relative: float = 0.5
    absolute: float = 0.05
    name = "disagreement"


@dataclass
class LengthSignal(DriftSignal):
    """Mean response length (tokens) drifting either way from its first rollouts."""

    metric: str = "response/length"
    direction: Direction = "either"
    relative: float = 0.5
    absolute: float = 4.0
    name = "length"


@dataclass
class DistinctSignal(DriftSignal):
    """Distinct-2 of the rollout's responses collapsing from its first rollouts."""

    metric: str = "diversity/distinct_2"
    direction: Direction = "down"
    relative: float = 0.3
    absolute: float = 0.05
    name = "distinct"


@dataclass
class KLSignal:
    """The KL per response (``objective/kl``, nats) above ``ceiling``, or its least-squares slope over
    the last ``window`` rollouts above ``max_rate`` nats per rollout; either or both."""

    action: Action | None = None
    ceiling: float | None = None
    max_rate: float | None = None
    window: int = 10
    patience: int = 1

    def check(self) -> None:
        """Refuse settings no run can use."""
        _check_common("kl", self.action, self.patience, self.window, fitted=True)
        if self.action is not None and self.ceiling is None and self.max_rate is None:
            raise ValueError("guard kl: set kl.ceiling or kl.max_rate (or both) with kl.action")

    def verdict(self, history: History, evaluations: Sequence[Evaluation] = ()) -> Verdict | None:
        """The ceiling's verdict if it holds, else the rate's; None when neither is available."""
        kl = history.get("objective/kl", [])
        verdicts = []
        if self.ceiling is not None:
            verdicts.append(above(kl, self.ceiling, "KL per response"))
        if self.max_rate is not None:
            verdicts.append(rate_above(kl, self.window, self.max_rate, "KL per response"))
        verdicts = [v for v in verdicts if v is not None]
        return next((v for v in verdicts if v.holds), verdicts[0] if verdicts else None)


@dataclass
class ObjectiveSignal:
    """The shaped objective (``objective/rlhf_reward``: score - beta * KL, the KL as ``kl.mode`` pays it) falling.

    Rule (:func:`~rlhf_lit.callbacks.guard.verdicts.falling`): the least-squares line through the
    last ``window`` rollouts falls by >= ``min_drop`` across the window with a t-statistic <=
    ``-min_t``: a fall larger than the rollout-to-rollout noise (a 0/1 reward's batch mean is noisy;
    a constant one has t 0 and never fires).
    """

    action: Action | None = None
    metric: str = "objective/rlhf_reward"
    window: int = 10
    min_drop: float = 0.1
    min_t: float = 3.0
    patience: int = 3

    def check(self) -> None:
        """Refuse settings no run can use."""
        _check_common("objective", self.action, self.patience, self.window, fitted=True)

    def verdict(self, history: History, evaluations: Sequence[Evaluation] = ()) -> Verdict | None:
        """The falling rule on ``metric``'s history."""
        return falling(history.get(self.metric, []), self.window, self.min_drop, self.min_t, self.metric)


@dataclass
class HeldOut:
    """The held-out evaluation: every ``every_n_rollouts`` rollouts the policy answers ``prompts``
    (its own seed: the same draws each time, the training stream untouched), the reward model scores
    the answers and ``judge`` (``"module:function"`` of response texts, e.g.
    ``rlhf_lit.evaluation.judges:vader``, or the directory of a reward-model export: a gold reward
    model, :func:`rlhf_lit.evaluation.load_judge`) judges them. Logged as ``guard/held_out/score`` and
    ``guard/held_out/judge``; read by ``proxy_gold`` (``source: held_out``) and ``keep_best``. The
    prompts are what ``OnlineGeneration`` takes (strings, conversations, or a prompt source: a file, a hub
    dataset, a fit config's held-out split, :class:`~rlhf_lit.data.prompt_source.PromptSource`; a string is a
    path) and reach the policy as its do (``chat_template``: rendered with the tokenizer's chat template when
    it has one, by default; :mod:`rlhf_lit.data.prompt_rendering`), and ``judge_reads: query_response`` gives
    the judge that rendered prompt + the response."""

    prompts: str | list[str | list[dict[str, str]]] | dict[str, Any] = field(default_factory=list)
    """As ``OnlineGeneration``'s (:data:`~rlhf_lit.callbacks.online_generation.CallbackPrompts`)."""
    every_n_rollouts: int = 5
    judge: str | None = None
    seed: int = 1234
    sampling: SamplingConfig | None = None
    chat_template: TemplateOption = "auto"
    judge_reads: JudgeReads = "response"

    def __post_init__(self) -> None:
        """Refuse a bad ``chat_template`` or a bad prompt now, naming it; keep the canonical value (an alias
        mapped) and the prompts as conversations or a source (read when fit starts)."""
        self.chat_template = template_choice(self.chat_template, "guard held_out.chat_template")
        if isinstance(self.prompts, (str, dict, PromptSource)):
            self.prompts = as_source(self.prompts)
        elif self.prompts:  # empty: no held-out evaluation, refused by the guard when it is asked for one
            self.prompts = given_prompts(self.prompts, "guard held_out")


@dataclass
class KeepBest:
    """What ``keep_best`` keeps: the policy with the highest ``metric - penalty_coef * penalty_metric``.

    A held-out metric (``guard/held_out/*``) judges the policy after that evaluation's rollout; a
    rollout metric (``objective/scores``, ``objective/judge``, ...) judges the policy that sampled
    that rollout (the one before its update), so the guard copies the policy before every rollout.
    """

    metric: str = HELD_OUT_JUDGE
    penalty_metric: str | None = None
    penalty_coef: float = 0.0

    def value(self, metrics: Mapping[str, float]) -> float | None:
        """The guarded value from one rollout's (or evaluation's) metrics; None if one is missing."""
        value = metrics.get(self.metric)
        if value is None:
            return None
        if self.penalty_metric is not None:
            penalty = metrics.get(self.penalty_metric)
            if penalty is None:
                return None
            value -= self.penalty_coef * penalty
        return value

    @property
    def held_out(self) -> bool:
        """Whether the metric is the held-out evaluation's."""
        return self.metric.startswith("guard/held_out/")

"""The config file of ``rlhf-lit iterate``: its typed choices (each a ``Literal``, defined here only) and a
strict reader whose every error names the file and the key.

    run_dir: logs/offline_iterate       # iteration t writes <run_dir>/iter_<t>/...
    iterations: 3
    seed: 1234                          # sampling seed of iteration t: seed + t; every fit: --seed_everything seed
    sft_model: assets/models/stories260K
    prompts: {path: assets/data/tinystories/val.txt, skip: 1000, words: 8, held_out: 8, per_iteration: 16}
                                        # or any prompt source: {path: Anthropic/hh-rlhf, split: test, ...},
                                        # {config: configs/ppo.yaml, split: val, ...}
    sampling: {responses_per_prompt: 4, max_new_tokens: 24, temperature: 1.0, batch_size: 64}
    labeler: {kind: judge, source: "rlhf_lit.evaluation.judges:vader"}
    reward_model: {config: configs/offline/iterate/reward_model.yaml, data: all, init: previous}
    ppo: {config: configs/offline/iterate/ppo.yaml, start: restart}
    evaluation: {judge: null}           # the gold scorer of the summary; null: the labeller

or, with ``policy: bonbon``, online best-of-N distillation: no reward-model refit, no PPO; each iteration's
policy is BoNBoN on the best and the worst of its own K samples (``bonbon: {config: ...}``).

Each group is a dataclass below; its fields (with their docstrings) are the keys it takes.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Union, get_args, get_origin

from rlhf_lit.commands.options import OptionError
from rlhf_lit.data.prompt_source import PromptSource, PromptSourceFormat
from rlhf_lit.run_seed import run_seed_problem

RewardData = Literal["all", "latest"]
"""What the reward model of iteration t trains on: ``all`` the labels so far (``initial_data`` and iterations
1..t), or ``latest`` iteration t's alone."""
RewardInit = Literal["previous", "sft"]
"""Where the reward model of iteration t starts: ``previous`` the reward model of iteration t - 1 (at t = 1
``initial_model``, or the SFT model when none is given), or ``sft`` the SFT model each time."""
PolicyStart = Literal["restart", "continue"]
"""Where PPO of iteration t starts: ``restart`` from the SFT model (policy and KL reference; Wolf, Kirk and
Musolesi 2025 find it the robust choice), or ``continue`` from iteration t - 1's PPO export (which PPO's
``sft_model`` then is: policy start and KL reference both)."""
PolicyStage = Literal["ppo", "bonbon"]
"""What trains the policy of each iteration: ``ppo`` (refit the reward model on the labels so far, then PPO
against it) or ``bonbon`` (online best-of-N distillation: BoNBoN on the best and the worst of the K samples the
current policy drew, ranked by a scoring labeller, starting from that policy, which is also BoNBoN's reference:
a moving anchor, so iteration t teaches the policy best-of-K of iteration t - 1's; no reward model is refitted)."""
LabelerKind = Literal["judge", "reward_model", "file"]
"""Who labels the policy's samples: ``judge`` a ``module:function`` judge (texts -> scores, as
:func:`rlhf_lit.evaluation.load_judge`), ``reward_model`` a held-out reward model directory (its scores),
or ``file`` labels a person wrote (``source`` a path with ``{t}``: rankings or pairs records)."""
JudgeReads = Literal["response", "query_response"]
"""As :data:`rlhf_lit.evaluation.judges.JudgeReads` (checked equal by the tests)."""


@dataclass
class PromptsGroup:
    """Prompts, from a prompt source (:class:`~rlhf_lit.data.prompt_source.PromptSource`, read as ``rlhf-lit
    evaluate --prompts`` reads it): the first ``held_out`` are the fixed evaluation set, then ``per_iteration``
    fresh ones per iteration."""

    path: str = ""
    """A file (``.jsonl`` / ``.json`` records in any prompt format, optionally ``.gz``; ``.txt``: one prompt per line)
    or a hub dataset name; or leave it empty and give ``config``."""
    config: str | None = None
    """A fit config: the prompts its data module holds out (``split: val``, the default) or trains on (``train``)."""
    split: str | None = None
    """A hub dataset's split (default ``train``), or a config's (``val`` or ``train``)."""
    subset: str | None = None
    """A hub dataset's subset."""
    format: PromptSourceFormat = "auto"
    """The record format (``auto``: detected; ``lines``; ``jsonl``; or one of the data modules' prompt formats)."""
    field: str | None = None
    """The column holding the prompt (null: the format's own)."""
    skip: int = 0
    """Leave out the source's first N prompts (e.g. those the PPO config trains on)."""
    words: int | None = None
    """Keep each prompt's first N words (TinyStories paragraphs as story openings); null keeps it whole."""
    held_out: int = 8
    """The first N prompts: the evaluation set of every iteration, never labelled."""
    per_iteration: int = 16
    """Fresh prompts sampled and labelled per iteration (prompts never repeat across iterations)."""

    def source(self) -> PromptSource:
        """The :class:`~rlhf_lit.data.prompt_source.PromptSource` these keys name (``ValueError`` for a bad one)."""
        return PromptSource(
            path=self.path or None,
            config=self.config,
            split=self.split,
            subset=self.subset,
            format=self.format,
            field=self.field,
            skip=self.skip,
        )


@dataclass
class SamplingGroup:
    """Sampling of the labelled responses and of the evaluation."""

    responses_per_prompt: int = 4
    """K responses per prompt, ranked by the labeller (K >= 2)."""
    max_new_tokens: int = 24
    """Most tokens per response."""
    temperature: float = 1.0
    """Sampling temperature (the KL is measured at it)."""
    batch_size: int = 64
    """Responses per generate call."""


@dataclass
class LabelerGroup:
    """The labeller (:data:`LabelerKind`)."""

    kind: LabelerKind = "judge"
    """``judge``, ``reward_model`` or ``file``."""
    source: str = ""
    """The judge spec, the reward-model directory, or the labels file path with ``{t}`` for the iteration."""
    judge_reads: JudgeReads = "response"
    """What a judge reads: the response, or the prompt + the response."""


@dataclass
class RewardModelGroup:
    """The reward-model refit of each iteration: an ordinary ``rlhf-lit fit`` of ``config``."""

    config: str = ""
    """The RewardModelModule config (the one a user writes); its model, train data and run directory are set per iteration."""
    data: RewardData = "all"
    """``all`` labels so far or ``latest`` (:data:`RewardData`)."""
    init: RewardInit = "previous"
    """``previous`` reward model or ``sft`` (:data:`RewardInit`)."""
    initial_model: str | None = None
    """A reward model before iteration 1 (its accuracy on iteration 1's samples; ``previous`` starts there)."""
    initial_data: str | None = None
    """Rankings or pairs records (JSONL) every ``all`` iteration trains on besides the new labels."""
    held_out_fraction: float = 0.25
    """Of each iteration's labelled prompts: kept out of training, to measure the RM's accuracy before and after."""
    options: list[str] = field(default_factory=list)
    """More ``fit`` options, as typed on the command line."""


@dataclass
class PPOGroup:
    """The PPO run of each iteration: an ordinary ``rlhf-lit fit`` of ``config``."""

    config: str = ""
    """The PPOModule config; its sft_model, reward_model and run directory are set per iteration."""
    start: PolicyStart = "restart"
    """``restart`` from SFT or ``continue`` (:data:`PolicyStart`)."""
    options: list[str] = field(default_factory=list)
    """More ``fit`` options, as typed on the command line."""


@dataclass
class BoNBoNGroup:
    """The BoNBoN run of each iteration (``policy: bonbon``): an ordinary ``rlhf-lit fit`` of ``config``."""

    config: str = ""
    """The BoNBoNModule config; its model (the current policy: start and reference), train data and run
    directory are set per iteration."""
    options: list[str] = field(default_factory=list)
    """More ``fit`` options, as typed on the command line."""


@dataclass
class EvaluationGroup:
    """The per-iteration evaluation of the policy on the held-out prompts."""

    judge: str | None = None
    """Gold scorer (``module:function``); null: the labeller when it scores (judge or reward model)."""


@dataclass
class IterateConfig:
    """The whole loop."""

    run_dir: str = ""
    """Everything goes under it: ``iter_<t>/`` per iteration, ``summary.json`` / ``summary.csv``."""
    iterations: int = 2
    """T, the number of iterations."""
    seed: int = 1234
    """Sampling seed (iteration t samples with ``seed + t``) and every fit's ``--seed_everything``."""
    sft_model: str = ""
    """The SFT model: the policy of iteration 1, PPO's start under ``restart``, the KL reference of the evaluation."""
    device: str = "cpu"
    """Torch device of the sampling, labelling and evaluation done by the command itself."""
    policy: PolicyStage = "ppo"
    """``ppo`` or ``bonbon`` (:data:`PolicyStage`)."""
    prompts: PromptsGroup = field(default_factory=PromptsGroup)
    sampling: SamplingGroup = field(default_factory=SamplingGroup)
    labeler: LabelerGroup = field(default_factory=LabelerGroup)
    reward_model: RewardModelGroup = field(default_factory=RewardModelGroup)
    ppo: PPOGroup = field(default_factory=PPOGroup)
    bonbon: BoNBoNGroup = field(default_factory=BoNBoNGroup)
    evaluation: EvaluationGroup = field(default_factory=EvaluationGroup)


REQUIRED = {
    "ppo": ("run_dir", "sft_model", "labeler.source", "reward_model.config", "ppo.config"),
    "bonbon": ("run_dir", "sft_model", "labeler.source", "bonbon.config"),
}
"""Keys without a usable default, per :data:`PolicyStage`."""
UNUSED = {
    "ppo": ("bonbon.config", "bonbon.options"),
    "bonbon": (
        "reward_model.config",
        "reward_model.options",
        "reward_model.initial_model",
        "reward_model.initial_data",
        "ppo.config",
        "ppo.options",
    ),
}
"""Keys a :data:`PolicyStage` does not use: set, they are refused (a loop that would ignore them silently)."""


def _accepts(hint: Any, value: Any) -> bool:
    """Whether ``value`` (from YAML) fits the annotation ``hint``."""
    origin = get_origin(hint)
    if origin is Literal:
        return value in get_args(hint)
    if origin in (Union, types.UnionType):
        return any(_accepts(h, value) for h in get_args(hint))
    if hint is type(None):
        return value is None
    if origin is list:
        return isinstance(value, list) and all(_accepts(get_args(hint)[0], v) for v in value)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _describe(hint: Any) -> str:
    """How an error names what a key takes."""
    if get_origin(hint) is Literal:
        return "one of " + ", ".join(map(str, get_args(hint)))
    if get_origin(hint) in (Union, types.UnionType):
        return " or ".join(_describe(h) for h in get_args(hint))
    if hint is type(None):
        return "null"
    if get_origin(hint) is list:
        return f"a list of {_describe(get_args(hint)[0])}s"
    return {str: "a string", int: "an integer", float: "a number"}.get(hint, str(hint))


def _build(cls: type, values: Any, path: str, where: str) -> Any:
    """``cls`` from a YAML mapping, every key checked (unknown keys, wrong types) with ``where: key`` errors."""
    if not isinstance(values, dict):
        raise OptionError(f"{where}: {path or 'the file'} must be a mapping, got {type(values).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in values.items():
        dotted = f"{path}.{key}" if path else str(key)
        if key not in names:
            raise OptionError(f"{where}: unknown key {dotted!r} (keys there: {', '.join(names)})")
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            kwargs[key] = _build(hint, value, dotted, where)
        elif not _accepts(hint, value):
            raise OptionError(f"{where}: {dotted} must be {_describe(hint)}, got {value!r}")
        else:
            kwargs[key] = value
    return cls(**kwargs)


def _get(config: IterateConfig, dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def check_values(config: IterateConfig, where: str) -> None:
    """The checks of values beyond their types (ranges, required keys, files that must exist): :class:`OptionError`."""
    for key in REQUIRED[config.policy]:
        if not _get(config, key):
            raise OptionError(f"{where}: {key} is required")
    for key in UNUSED[config.policy]:
        if _get(config, key):
            raise OptionError(f"{where}: {key}: policy {config.policy} does not use it; leave it out")
    if config.policy == "bonbon" and config.labeler.kind == "file":
        raise OptionError(
            f"{where}: labeler.kind file: policy bonbon picks the best and the worst of each prompt's samples by "
            "their scores; label with a judge or a reward model"
        )
    for key in ("iterations", "prompts.per_iteration", "sampling.max_new_tokens", "sampling.batch_size"):
        if _get(config, key) < 1:
            raise OptionError(f"{where}: {key} must be >= 1, got {_get(config, key)}")
    try:
        config.prompts.source()
    except ValueError as error:
        raise OptionError(f"{where}: prompts: {error}") from None
    if config.prompts.held_out < 1:
        raise OptionError(f"{where}: prompts.held_out must be >= 1 (the evaluation set), got {config.prompts.held_out}")
    if config.prompts.words is not None and config.prompts.words < 1:
        raise OptionError(f"{where}: prompts.words must be >= 1 or null, got {config.prompts.words}")
    if config.sampling.responses_per_prompt < 2:
        raise OptionError(
            f"{where}: sampling.responses_per_prompt must be >= 2 (a ranking needs two), "
            f"got {config.sampling.responses_per_prompt}"
        )
    if not 0 < config.sampling.temperature < math.inf:  # inf: a uniform draw over the vocabulary
        raise OptionError(
            f"{where}: sampling.temperature must be a finite number > 0, got {config.sampling.temperature}"
        )
    if problem := run_seed_problem(config.seed, "seed"):  # every fit's --seed_everything, which would refuse it
        raise OptionError(f"{where}: {problem}")
    if not 0 <= config.reward_model.held_out_fraction < 1:
        raise OptionError(
            f"{where}: reward_model.held_out_fraction must be in [0, 1), got {config.reward_model.held_out_fraction}"
        )
    if config.labeler.kind == "file" and "{t}" not in config.labeler.source:
        raise OptionError(
            f"{where}: labeler.source {config.labeler.source!r} needs {{t}} (one labels file per iteration)"
        )
    for key in ("reward_model.config", "ppo.config", "bonbon.config", "reward_model.initial_data"):
        path = _get(config, key)
        if path and not os.path.isfile(path):
            raise OptionError(f"{where}: {key} {path}: no such file")


def read_config(path: str) -> IterateConfig:
    """The :class:`IterateConfig` of a YAML file; an :class:`OptionError` naming the file and key for any mistake."""
    from rlhf_lit.config_files import read_yaml_mapping

    try:
        values = read_yaml_mapping(path)
    except (OSError, ValueError) as error:
        raise OptionError(f"--config {error}") from None
    config = _build(IterateConfig, values, "", path)
    check_values(config, path)
    return config

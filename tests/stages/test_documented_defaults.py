"""Every default the documentation quotes is the real default of the constructor, dataclass or function.

Each row of :data:`QUOTED` names the file that quotes a default (a page under docs/, or a docstring
that the API pages in docs/api/ render), the quoted words, the owner of the option and its path, and
the value the words state. The test checks both sides: the words are still in that file (a page
rewritten without them must update this table) and the real default, read with
``inspect.signature`` / ``dataclasses.fields`` (never by building an object), equals the value. A
default that moves without its documentation fails here.

:data:`PINNED` holds the defaults the PPO and DPO recipes rest on that no page states as a number
(clip range, KL target, DPO beta ...): pinned to their value so that a change is a decision, not an
accident.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any, NamedTuple

import pytest
from assets_paths import ROOT

from rlhf_lit.callbacks import OnlineGeneration
from rlhf_lit.callbacks.guard import HeldOut
from rlhf_lit.commands.best_of_n_command import build_parser as best_of_n_parser
from rlhf_lit.commands.evaluate_command import build_parser as evaluate_parser
from rlhf_lit.data import Fields, PreferenceDataModule, PromptDataModule, SFTDataModule
from rlhf_lit.functional import grpo_advantages, kl_loss, reinforce_pp_advantages
from rlhf_lit.models.lora import LoRAConfig
from rlhf_lit.rewards.shaping import regex_format
from rlhf_lit.stages import BoNBoNModule, DPOModule, PPOModule, RewardModelModule, SFTModule
from rlhf_lit.stages.ppo.config import KLConfig, PPOConfig, RewardConfig, RewardSource


class Quoted(NamedTuple):
    """A default as a file states it: ``owner``'s option ``path`` defaults to ``value``."""

    doc: str  # the file, relative to the checkout
    quote: str  # words of that file (whitespace-normalised) that state the default
    owner: Any  # a class (its __init__ signature), a dataclass (its fields) or a function
    path: str  # "param" or "param.attribute..." (attributes of the parameter's default)
    value: Any


PPO_DOC = "rlhf_lit/stages/ppo/__init__.py"  # the package docstring: PPO's implementation details
PPO_CONFIG_DOC = "rlhf_lit/stages/ppo/config.py"  # rendered in docs/api/stages.md
STAGES = (SFTModule, RewardModelModule, PPOModule, DPOModule, BoNBoNModule)

QUOTED: list[Quoted] = [
    # PPO: GAE, value loss, optimizer, critic (ppo.py's implementation details).
    Quoted(PPO_DOC, "GAE with gamma 1, lambda 0.95 by default", PPOModule, "ppo.gamma", 1.0),
    Quoted(PPO_DOC, "GAE with gamma 1, lambda 0.95 by default", PPOModule, "ppo.lam", 0.95),
    Quoted(
        PPO_DOC, "advantages whitened over the batch (N detail 12; cleanrl)", PPOModule, "ppo.whiten_advantages", True
    ),
    Quoted(PPO_DOC, "Clipped value loss, vf_coef 0.1 (N detail 13)", PPOModule, "ppo.vf_coef", 0.1),
    Quoted(
        PPO_DOC,
        "Adam eps configurable (N detail 15: PyTorch placement; default 1e-5 as in cleanrl / N+)",
        PPOModule,
        "optimizer.eps",
        1e-5,
    ),
    Quoted(
        PPO_DOC,
        "the critic is a separate model initialised from the RM (N+ detail 16)",
        PPOModule,
        "critic",
        "separate",
    ),
    Quoted("docs/DEMO.md", "(`critic: separate`, the library default, N+ detail 16)", PPOModule, "critic", "separate"),
    Quoted("docs/ppo.md", "reference responses per prompt (default 8)", PPOModule, "reward.calibration_samples", 8),
    Quoted("docs/ppo.md", "`none` (default) or `reference_quantile`", PPOModule, "reward.calibration", "none"),
    Quoted(PPO_DOC, "Optional entropy bonus (cleanrl) and PPO-ptx", PPOModule, "ppo.entropy_coef", 0.0),
    Quoted(PPO_DOC, "Optional entropy bonus (cleanrl) and PPO-ptx", PPOModule, "ppo.ptx_coef", 0.0),
    # PPOConfig / KLConfig / RewardConfig field documentation.
    Quoted(PPO_CONFIG_DOC, "epochs: passes over the rollout (K in the PPO paper; N+ uses 4)", PPOConfig, "epochs", 4),
    Quoted(
        PPO_CONFIG_DOC,
        "value_clip_range: how far a value may move from its rollout value (N detail 13: 0.2)",
        PPOConfig,
        "value_clip_range",
        0.2,
    ),
    Quoted(
        PPO_CONFIG_DOC,
        "vf_coef: weight of the value loss in the summed loss (N detail 13: 0.1)",
        PPOConfig,
        "vf_coef",
        0.1,
    ),
    Quoted(PPO_CONFIG_DOC, "gamma: discount of GAE (1 in RLHF: the episode is one response)", PPOConfig, "gamma", 1.0),
    Quoted(PPO_CONFIG_DOC, "lam: lambda of GAE (N detail 12: 0.95)", PPOConfig, "lam", 0.95),
    Quoted(
        PPO_CONFIG_DOC,
        "entropy_coef: weight of an entropy bonus (0 = off; InstructGPT uses none)",
        PPOConfig,
        "entropy_coef",
        0.0,
    ),
    Quoted(
        PPO_CONFIG_DOC,
        "init_coef: the KL coefficient beta at the start (N detail 11: 0.15; N+ fixed 0.05)",
        PPOModule,
        "kl.init_coef",
        0.15,
    ),
    Quoted(PPO_CONFIG_DOC, "(Ziegler et al. 2019; the InstructGPT recipe's default)", KLConfig, "kind", "adaptive"),
    Quoted(PPO_CONFIG_DOC, "per token in the reward (InstructGPT, the default)", KLConfig, "mode", "reward"),
    Quoted(PPO_CONFIG_DOC, "``k3_weighted`` (the default), k3 times", KLConfig, "loss_estimator", "k3_weighted"),
    Quoted("docs/ppo.md", "`k3_weighted` (the default)", KLConfig, "loss_estimator", "k3_weighted"),
    Quoted(
        PPO_CONFIG_DOC,
        "default: the learned reward model with weight 1",
        RewardConfig,
        "sources",
        [RewardSource(name="reward_model", weight=1.0, function=None)],
    ),
    # PPO: estimators, reading cut responses, old logprobs (docs pages).
    Quoted("docs/rewards.md", "gae (default, critic)", PPOModule, "ppo.estimator", "gae"),
    Quoted("docs/ppo.md", "(the default `as_sampled` reads it as it is)", PPOModule, "reward.unfinished", "as_sampled"),
    Quoted("docs/ppo.md", "(`ppo.whiten_scope: global`, the default", PPOModule, "ppo.whiten_scope", "global"),
    Quoted("docs/ppo.md", "(`sampling.decode`): `eager` (the default)", PPOModule, "sampling.decode", "eager"),
    Quoted(
        "docs/performance.md", "`sampling.decode: compiled` (off by default)", PPOModule, "sampling.decode", "eager"
    ),
    Quoted(PPO_DOC, "(``ppo.whiten_scope: global``, the default", PPOModule, "ppo.whiten_scope", "global"),
    Quoted("docs/rewards.md", "`as_sampled` (the default) or `with_eos`", RewardConfig, "unfinished", "as_sampled"),
    Quoted("docs/DEMO.md", "the library default stays `as_sampled`", RewardConfig, "unfinished", "as_sampled"),
    Quoted("docs/ppo.md", "(`ppo.forward`): `eager` (the default)", PPOModule, "ppo.forward", "eager"),
    Quoted("docs/performance.md", "`ppo.forward: compiled` (off by default)", PPOConfig, "forward", "eager"),
    Quoted("docs/performance.md", "by default (`data.drop_last: true`)", PromptDataModule, "drop_last", True),
    Quoted(
        "docs/performance.md",
        "(off by default): the old logprobs from the logits",
        PPOConfig,
        "old_logprobs",
        "rescore",
    ),
    Quoted("docs/performance.md", "so the default stays the exact rescore", PPOModule, "ppo.old_logprobs", "rescore"),
    # The reward model's and DPO's schedules.
    Quoted(
        "rlhf_lit/stages/reward_model.py",
        'which is this module\'s default ``optimizer.schedule="linear"``',
        RewardModelModule,
        "optimizer.schedule",
        "linear",
    ),
    Quoted(
        "rlhf_lit/stages/reward_model.py",
        "by default annealed linearly to 0 over the run",
        RewardModelModule,
        "optimizer.min_lr_ratio",
        0.0,
    ),
    Quoted(
        "rlhf_lit/stages/dpo.py",
        "by default annealed linearly to 0 over the run",
        DPOModule,
        "optimizer.schedule",
        "linear",
    ),
    Quoted(
        "rlhf_lit/stages/dpo.py",
        "by default annealed linearly to 0 over the run",
        DPOModule,
        "optimizer.min_lr_ratio",
        0.0,
    ),
    Quoted(
        "rlhf_lit/stages/dpo.py",
        "By default the reference logprobs are computed per batch",
        DPOModule,
        "precompute_ref",
        False,
    ),
    # BoNBoN: N from the records, beta from N, the SFT term's weight.
    Quoted("docs/bonbon.md", "rlhf-lit's default is 0.005", BoNBoNModule, "alpha", 0.005),
    Quoted("rlhf_lit/stages/bonbon.py", "0.005 by default: the IPO term", BoNBoNModule, "alpha", 0.005),
    Quoted("docs/bonbon.md", "| `n` | `null` | N. Unset: the records' `n`", BoNBoNModule, "n", None),
    Quoted("docs/bonbon.md", "| `beta` | `null` | IPO's coefficient; unset: `beta_N`", BoNBoNModule, "beta", None),
    Quoted("docs/bonbon.md", "| `alpha` | `0.005` |", BoNBoNModule, "alpha", 0.005),
    # Every stage: skipped updates, pad policy.
    *(
        Quoted("docs/reliability.md", "`max_skipped_updates` in a row (default 3)", stage, "max_skipped_updates", 3)
        for stage in STAGES
    ),
    *(
        Quoted("docs/data.md", "`missing_pad` policy (`add` by default", stage, "missing_pad", "add")
        for stage in STAGES
    ),
    Quoted("docs/data.md", "`fields.responses`, default `responses`", Fields, "responses", "responses"),
    *(
        Quoted(
            "docs/data.md",
            "`auto` (default) | `always` when the tokenizer has a chat template",
            data,
            "hh_render",
            "auto",
        )
        for data in (SFTDataModule, PreferenceDataModule, PromptDataModule)
    ),
    # Reward-model ensembles.
    Quoted(
        "docs/reward_model.md",
        "`members: 1` (the default) is the single reward model",
        RewardModelModule,
        "ensemble.members",
        1,
    ),
    Quoted(
        "docs/reward_model.md",
        "`data_weights: uniform` is the default",
        RewardModelModule,
        "ensemble.data_weights",
        "uniform",
    ),
    Quoted("docs/ppo.md", "| `mean` (default) | the members' mean |", RewardSource, "aggregate", "mean"),
    # LoRA.
    Quoted("docs/lora.md", "`lora.export: merged` (default)", LoRAConfig, "export", "merged"),
    Quoted("docs/lora.md", "target_modules: null = default for the architecture", LoRAConfig, "target_modules", None),
    # The commands' options.
    *(
        Quoted("docs/cli.md", "| `--prompt-format` | `auto` (default),", parser, "--prompt-format", "auto")
        for parser in (evaluate_parser, best_of_n_parser)
    ),
    Quoted(
        "docs/cli.md",
        "(default `as_sampled`; the demo passes its PPO config's)",
        evaluate_parser,
        "--unfinished",
        "as_sampled",
    ),
    Quoted(
        "docs/cli.md",
        "(default `as_sampled`; the demo passes its PPO config's)",
        best_of_n_parser,
        "--unfinished",
        "as_sampled",
    ),
    # Prompts outside the data modules: one default for the commands, the callback and the guard.
    *(
        Quoted("docs/cli.md", "as `--chat-template` says: `auto` (default)", parser, "--chat-template", "auto")
        for parser in (evaluate_parser, best_of_n_parser)
    ),
    *(
        Quoted("docs/data.md", "| a string, `chat_template: auto` (default) |", owner, "chat_template", "auto")
        for owner in (OnlineGeneration, HeldOut)
    ),
    Quoted("docs/monitoring.md", "`chat_template: auto` (default)", OnlineGeneration, "chat_template", "auto"),
    Quoted(
        "docs/monitoring.md",
        "(`held_out.chat_template: auto | always | never`, default `auto`)",
        HeldOut,
        "chat_template",
        "auto",
    ),
    *(
        Quoted(
            "docs/data.md", "Every data module takes `chat_template` (default `auto`)", data, "chat_template", "auto"
        )
        for data in (SFTDataModule, PreferenceDataModule, PromptDataModule)
    ),
    # The estimators' and shaping functions' signatures as the contracts write them.
    Quoted(
        "docs/CONTRACTS.md",
        "`grpo_advantages(scores, mask, k, scale_by_std=True, eps=1e-4)`",
        grpo_advantages,
        "scale_by_std",
        True,
    ),
    Quoted(
        "docs/CONTRACTS.md",
        "`grpo_advantages(scores, mask, k, scale_by_std=True, eps=1e-4)`",
        grpo_advantages,
        "eps",
        1e-4,
    ),
    Quoted(
        "docs/CONTRACTS.md",
        "`reinforce_pp_advantages(rewards, mask, gamma=1.0)`",
        reinforce_pp_advantages,
        "gamma",
        1.0,
    ),
    Quoted(
        "docs/CONTRACTS.md",
        '`kl_loss(logprobs, ref_logprobs, mask, kind="k3_weighted", old_logprobs=None, distributions=None)`',
        kl_loss,
        "kind",
        "k3_weighted",
    ),
    Quoted(
        "docs/CONTRACTS.md",
        "`regex_format(pattern, matched=1, unmatched=0, whole_response=False)`",
        regex_format,
        "matched",
        1.0,
    ),
    Quoted(
        "docs/CONTRACTS.md",
        "`regex_format(pattern, matched=1, unmatched=0, whole_response=False)`",
        regex_format,
        "unmatched",
        0.0,
    ),
    Quoted(
        "docs/CONTRACTS.md",
        "`regex_format(pattern, matched=1, unmatched=0, whole_response=False)`",
        regex_format,
        "whole_response",
        False,
    ),
]
"""The defaults the documentation states, with where and how it states them."""

PINNED: list[tuple[Any, str, Any]] = [
    (PPOModule, "ppo.clip_range", 0.2),
    (PPOModule, "kl.target", 6.0),
    (PPOModule, "kl.horizon", 10000),
    (PPOModule, "kl.estimator", "k1"),
    (PPOModule, "ppo.max_grad_norm", 1.0),
    (PPOModule, "optimizer.lr", 1e-5),
    (PPOModule, "sampling.temperature", 1.0),
    (DPOModule, "beta", 0.1),
    (DPOModule, "loss", "sigmoid"),
    (DPOModule, "label_smoothing", 0.0),
    (RewardModelModule, "normalize", "bias"),
]
"""(owner, path, value) of recipe defaults no page quotes as a number: changed only on purpose."""


def _normalised(text: str) -> str:
    """``text`` with every run of whitespace (line breaks and docstring indentation) as one space."""
    return re.sub(r"\s+", " ", text)


def default_of(owner: Any, path: str) -> Any:
    """The default of ``path`` on ``owner``, read from its declaration without building it.

    ``owner`` is an argparse parser factory (``path`` is then an option string such as
    ``--prompt-field``), a dataclass (its field's default or default factory), or a class / function
    (its signature's parameter); the dotted rest of ``path`` reads attributes of that default
    (``"ppo.gamma"``: the ``gamma`` of ``PPOModule``'s default ``ppo``)."""
    if path.startswith("--"):
        parser = owner()
        (action,) = [a for a in parser._actions if path in a.option_strings]
        return action.default
    name, *rest = path.split(".")
    if dataclasses.is_dataclass(owner):
        (field,) = [f for f in dataclasses.fields(owner) if f.name == name]
        value = field.default_factory() if field.default is dataclasses.MISSING else field.default
    else:
        parameter = _parameter(owner, name)
        assert parameter.default is not inspect.Parameter.empty, f"{owner.__name__}.{name} has no default"
        value = parameter.default
    for attribute in rest:
        value = getattr(value, attribute)
    return value


def _parameter(owner: Any, name: str) -> inspect.Parameter:
    """The parameter ``name`` of a function, or of a class's constructor: its own, or one its
    ``**stage_args`` passes on to a base class (``PretrainedStage``), as the command line resolves it."""
    if not inspect.isclass(owner):
        return inspect.signature(owner).parameters[name]
    for cls in owner.__mro__:
        if "__init__" in vars(cls):
            parameters = inspect.signature(cls.__init__).parameters
            if name in parameters:
                return parameters[name]
            if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
                break  # the constructor passes nothing further up
    raise KeyError(f"{owner.__name__} takes no argument {name!r}")


def _row_id(row: Quoted) -> str:
    """``<doc>:<owner>.<path>``: which row failed."""
    return f"{row.doc}:{getattr(row.owner, '__name__', row.owner)}.{row.path}"


@pytest.mark.parametrize("row", QUOTED, ids=_row_id)
def test_a_quoted_default_is_the_real_default(row):
    text = _normalised((ROOT / row.doc).read_text(encoding="utf-8"))
    assert _normalised(row.quote) in text, f"{row.doc} no longer says {row.quote!r}: update QUOTED"
    actual = default_of(row.owner, row.path)
    assert actual == row.value and type(actual) is type(row.value), (
        f"{_row_id(row)} defaults to {actual!r}, but {row.doc} says {row.value!r} ({row.quote!r})"
    )


@pytest.mark.parametrize("owner,path,value", PINNED, ids=[f"{o.__name__}.{p}" for o, p, _ in PINNED])
def test_a_pinned_recipe_default_is_unchanged(owner, path, value):
    actual = default_of(owner, path)
    assert actual == value and type(actual) is type(value), f"{owner.__name__}.{path} defaults to {actual!r}"


def test_default_of_reads_each_kind_of_declaration():
    # The reader itself: a dataclass field with a factory, a nested signature default, an argparse
    # option, and a parameter without a default (refused rather than read as a value).
    assert default_of(RewardConfig, "sources") == [RewardSource(name="reward_model")]
    assert default_of(PPOModule, "optimizer.lr") == 1e-5 and default_of(PPOModule, "optimizer.eps") == 1e-5
    assert default_of(SFTModule, "optimizer.eps") == 1e-8  # the OptimizerConfig default: PPO's differs
    assert default_of(evaluate_parser, "--prompt-format") == "auto"
    with pytest.raises(AssertionError, match="has no default"):
        default_of(grpo_advantages, "k")

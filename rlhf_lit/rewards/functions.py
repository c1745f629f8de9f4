"""Reward functions named ``module:function``: the batch they see, how they are loaded and checked.

A reward function is a plain callable ``fn(batch: RewardBatch, **params)`` returning either

- one real number per response (a list / tuple, or a 1-D tensor), or
- a dict of named components, each one number per response; the source's score is the sum of
  its components (the caller sums them and applies the source's weight).

:func:`call_reward_function` turns either form into ``{name: (B,) float32}`` or
``{name/component: (B,) float32}`` (CPU tensors, no gradient; the caller places the score at the
last response token on its device) and refuses, with a ``ValueError`` naming the function, any
return value of the wrong length, with a non-finite value, or of the wrong type. A bad reward
must stop the run, not become a NaN advantage three steps later.

Parameters come from the config as keyword arguments, in PPO's ``reward.sources``
(:func:`load_reward_function` takes the same fields)::

    reward:
      sources:
        - {name: rm}                                  # function: null = the learned reward model
        - name: length
          function: rlhf_lit.rewards.shaping:length_target
          kwargs: {target: 48, per_token: 0.02}
          weight: 1.0                                 # logged as reward/length

so a function declares its parameters keyword-only after the batch
(``def length_target(batch, *, target, per_token=0.01)``), which also makes it
``functools.partial``-friendly. Unknown or missing parameters are refused when the function is
loaded, not at the first rollout.

This module imports torch and the standard library only (it sits below ``stages/``).
"""

from __future__ import annotations

import functools
import inspect
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from rlhf_lit.callable_specs import resolve_callable


@dataclass(frozen=True)
class RewardBatch:
    """What a reward function sees: one entry per response, all lists of the same length B.

    Attributes:
        prompts: the decoded prompts (without padding or special tokens).
        responses: the decoded responses, without the prompt (the judge's text, see
            ``rlhf_lit.evaluation.response_texts``).
        response_ids: the generated token ids of each response, up to and including EOS when it
            ended, no padding. Pass ids, not re-tokenised text, to anything that counts tokens
            (decoding and re-encoding is not a bijection).
        ended: whether each response ended with EOS (False: cut at the length limit).
        extras: extra columns of the prompt dataset (e.g. ``ground_truth``), one list per column,
            each of length B; named by the prompt data module's ``fields`` mapping.
    """

    prompts: list[str]
    responses: list[str]
    response_ids: list[list[int]]
    ended: list[bool]
    extras: dict[str, list] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A length mismatch here is the builder's bug (not the reward function's): say which list.
        lengths = {name: len(getattr(self, name)) for name in ("prompts", "responses", "response_ids", "ended")}
        lengths.update({f"extras[{key!r}]": len(value) for key, value in self.extras.items()})
        if len(set(lengths.values())) > 1:
            raise ValueError(f"RewardBatch: every field needs one entry per response, got lengths {lengths}")

    def __len__(self) -> int:
        return len(self.responses)


def _describe(value: Any) -> str:
    return "None" if value is None else type(value).__name__


def _as_scores(value: Any, size: int, who: str) -> torch.Tensor:
    """One checked ``(size,)`` float32 CPU tensor from a list / tuple / 1-D tensor of reals."""
    if isinstance(value, torch.Tensor):
        if value.ndim != 1:
            raise ValueError(f"{who} returned a tensor of shape {tuple(value.shape)}; expected ({size},)")
        if value.is_complex():
            raise ValueError(f"{who} returned a tensor of dtype {value.dtype}; expected real numbers")
        scores = value.detach().to("cpu", torch.float32)  # (B,)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            real = isinstance(v, numbers.Real) or (isinstance(v, torch.Tensor) and v.ndim == 0 and not v.is_complex())
            if not real:
                hint = " (skipping a response with None is not supported)" if v is None else ""
                raise ValueError(f"{who} returned {_describe(v)} at index {i}; expected a real number{hint}")
        scores = torch.tensor([float(v) for v in value], dtype=torch.float32)  # (B,)
    else:
        raise ValueError(
            f"{who} returned {_describe(value)}; expected a list of floats (one per response) or a dict of named lists"
        )
    if scores.shape[0] != size:
        raise ValueError(f"{who} returned {scores.shape[0]} values for {size} responses")
    bad = (~torch.isfinite(scores)).nonzero()  # (n_bad, 1)
    if bad.numel():
        i = int(bad[0, 0])
        raise ValueError(
            f"{who} returned a non-finite value {scores[i].item()} at index {i} (NaN, inf, or beyond float32)"
        )
    return scores


def call_reward_function(fn: Callable[[RewardBatch], Any], batch: RewardBatch, name: str) -> dict[str, torch.Tensor]:
    """Call ``fn(batch)`` and check what it returns.

    Args:
        fn: the reward function, parameters already bound (``functools.partial``).
        batch: the responses to score.
        name: the source's name: the key of a plain return, the prefix ``name/`` of the keys of a
            dict return, and the name every error message gives.

    Returns:
        ``{name: scores}`` for a list / tuple / 1-D tensor return, ``{f"{name}/{key}": scores}``
        for a dict return; every value a ``(B,)`` float32 CPU tensor without gradient.

    Raises:
        ValueError: naming the function, when the return value has the wrong type (not a list,
            tuple, 1-D real tensor or non-empty dict with string keys; an element that is not a
            real number, None included), the wrong length, or a non-finite value. An exception
            raised inside ``fn`` propagates unchanged, with a note naming the function.
    """
    try:
        out = fn(batch)
    except Exception as e:
        e.add_note(f"raised inside reward function {name!r}")
        raise
    who = f"reward function {name!r}"
    size = len(batch)
    if isinstance(out, Mapping):
        if not out:
            raise ValueError(f"{who} returned an empty dict; expected named lists of one value per response")
        components = {}
        for key, value in out.items():
            if not isinstance(key, str) or not key:
                raise ValueError(f"{who} returned a dict key {key!r}; component names must be non-empty strings")
            components[f"{name}/{key}"] = _as_scores(value, size, f"{who} (component {key!r})")
        return components
    return {name: _as_scores(out, size, who)}


class RewardFunction:
    """A loaded, checked reward function; picklable (it holds the spec, not the function).

    Calling it scores a :class:`RewardBatch` through :func:`call_reward_function`. Pickling
    re-imports the function by its spec, so a module holding one can go to spawned processes.
    """

    def __init__(self, spec: str, kwargs: Mapping[str, Any] | None = None, name: str | None = None) -> None:
        self.spec = spec
        self.kwargs = dict(kwargs or {})
        self.fn = resolve_callable(spec, "reward function spec", "rlhf_lit.rewards.shaping:length_target")
        self.name = spec.partition(":")[2] if name is None else name
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"reward function {spec!r}: name must be a non-empty string, got {name!r}")
        try:
            signature = inspect.signature(self.fn)
        except (TypeError, ValueError):  # some builtins have no signature: checked when called
            signature = None
        if signature is not None:
            try:
                signature.bind(None, **self.kwargs)  # None stands for the batch
            except TypeError as e:
                raise ValueError(
                    f"reward function {spec!r} does not accept the parameters {sorted(self.kwargs)}: {e} "
                    f"(its signature: {signature})"
                ) from e

    def __call__(self, batch: RewardBatch) -> dict[str, torch.Tensor]:
        """Score ``batch``: ``{name: (B,)}`` or ``{name/component: (B,)}``, checked."""
        try:
            return call_reward_function(functools.partial(self.fn, **self.kwargs), batch, self.name)
        except ValueError as e:
            if self.name != self.spec:
                e.add_note(f"reward function {self.name!r} is {self.spec!r} with parameters {self.kwargs}")
            raise

    def __reduce__(self):
        return RewardFunction, (self.spec, self.kwargs, self.name)

    def __repr__(self) -> str:
        return f"RewardFunction({self.spec!r}, kwargs={self.kwargs!r}, name={self.name!r})"


def load_reward_function(spec: str, kwargs: Mapping[str, Any] | None = None, name: str | None = None) -> RewardFunction:
    """Load the reward function named by ``spec`` with its parameters bound.

    Args:
        spec: ``"module:function"`` (``"pkg.mod:Class.method"`` also works), e.g.
            ``"rlhf_lit.rewards.shaping:regex_format"``.
        kwargs: keyword parameters passed on every call (a YAML ``kwargs:`` mapping).
        name: the name logged (``reward/<name>``) and given in errors; default: the part of the
            spec after the colon. Two sources using one function need distinct names.

    Raises:
        ValueError: a malformed spec, a missing module or attribute, a non-callable target, an
            empty name, or ``kwargs`` the function's signature does not accept (unknown names or
            required parameters missing).
    """
    return RewardFunction(spec, kwargs, name)

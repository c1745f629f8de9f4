"""Built-in shaping rewards: a length penalty, a length target and a format rule (a regex).

Each is a plain reward function ``fn(batch, *, params)``, usable by spec, e.g.
``load_reward_function("rlhf_lit.rewards.shaping:length_target", {"target": 48})``, or with
``functools.partial``. Lengths are counted in response token ids (``batch.response_ids``,
including the EOS when the response ended), because the policy acts in tokens and re-tokenised
text may count differently. The missing-EOS penalty stays where it is (PPO's
``missing_eos_penalty``); it is not duplicated here.
"""

from __future__ import annotations

import math
import re

from rlhf_lit.rewards.functions import RewardBatch


def _check_per_token(fn: str, per_token: float) -> None:
    # A negative rate would turn the penalty into a bonus for length: refuse, never reinterpret.
    if not (isinstance(per_token, (int, float)) and math.isfinite(per_token) and per_token >= 0):
        raise ValueError(f"{fn}: per_token must be a finite number >= 0, got {per_token!r}")


def _check_length(fn: str, what: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{fn}: {what} must be an int >= 0 (tokens), got {value!r}")


def length_penalty(batch: RewardBatch, *, max_tokens: int, per_token: float = 0.01) -> list[float]:
    """``-per_token * max(0, n - max_tokens)``: a linear penalty on tokens beyond ``max_tokens``.

    Responses up to ``max_tokens`` tokens are not touched. DAPO's overlong shaping is this ramp
    with ``max_tokens = L_max - L_cache`` and ``per_token = 1 / L_cache`` (its floor at -1 is
    reached at the generation limit).

    Args:
        batch: the responses; ``n = len(response_ids[i])``.
        max_tokens: the length, in tokens, from which each further token costs ``per_token``.
        per_token: penalty per token beyond ``max_tokens`` (>= 0).
    """
    _check_length("length_penalty", "max_tokens", max_tokens)
    _check_per_token("length_penalty", per_token)
    return [-per_token * max(0, len(ids) - max_tokens) for ids in batch.response_ids]


def length_target(batch: RewardBatch, *, target: int, per_token: float = 0.01) -> list[float]:
    """``-per_token * |n - target|``: 0 at the target length, less the further away either way.

    Args:
        batch: the responses; ``n = len(response_ids[i])``.
        target: the wanted length in tokens.
        per_token: penalty per token of distance from ``target`` (>= 0).
    """
    _check_length("length_target", "target", target)
    _check_per_token("length_target", per_token)
    return [-per_token * abs(len(ids) - target) for ids in batch.response_ids]


def regex_format(
    batch: RewardBatch, *, pattern: str, matched: float = 1.0, unmatched: float = 0.0, whole_response: bool = False
) -> list[float]:
    """``matched`` where the regular expression matches the response text, else ``unmatched``.

    The response is the decoded text without the prompt. Python ``re`` syntax; flags go inline
    (``(?s)`` lets ``.`` cross newlines, ``(?i)`` ignores case).

    Args:
        batch: the responses.
        pattern: the regular expression.
        matched: reward when it matches.
        unmatched: reward when it does not (e.g. -1 for a penalty).
        whole_response: the pattern must match the whole response (``re.fullmatch``); False: a
            match anywhere in it (``re.search``).
    """
    try:
        compiled = re.compile(pattern)
    except (re.error, TypeError) as e:
        raise ValueError(f"regex_format: pattern {pattern!r} is not a valid regular expression: {e}") from e
    for what, value in (("matched", matched), ("unmatched", unmatched)):
        if not (isinstance(value, (int, float)) and math.isfinite(value)):
            raise ValueError(f"regex_format: {what} must be a finite number, got {value!r}")
    find = compiled.fullmatch if whole_response else compiled.search
    return [float(matched) if find(text) else float(unmatched) for text in batch.responses]

"""Built-in shaping rewards: a length penalty, a length target, a penalty for unfinished responses and a
format rule (a regex).

Each is a plain reward function ``fn(batch, *, params)``, usable by spec, e.g.
``load_reward_function("rlhf_lit.rewards.shaping:length_target", {"target": 48})``, or with
``functools.partial``. Lengths are counted in response token ids (``batch.response_ids``,
including the EOS when the response ended), because the policy acts in tokens and re-tokenised
text may count differently. PPO's ``reward.missing_eos_penalty`` REPLACES an unfinished response's
score; :func:`unfinished_penalty` here is ADDED to it, so the reward model's signal still reaches
those responses.
"""

from __future__ import annotations

import math
import re

from rlhf_lit.rewards.functions import RewardBatch


def _check_non_negative(fn: str, what: str, value: float) -> None:
    # A negative penalty would turn it into a bonus: refuse, never reinterpret (a bool is no amount).
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{fn}: {what} must be a finite number >= 0, got {value!r}")


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
    _check_non_negative("length_penalty", "per_token", per_token)
    return [-per_token * max(0, len(ids) - max_tokens) for ids in batch.response_ids]


def length_target(batch: RewardBatch, *, target: int, per_token: float = 0.01) -> list[float]:
    """``-per_token * |n - target|``: 0 at the target length, less the further away either way.

    Args:
        batch: the responses; ``n = len(response_ids[i])``.
        target: the wanted length in tokens.
        per_token: penalty per token of distance from ``target`` (>= 0).
    """
    _check_length("length_target", "target", target)
    _check_non_negative("length_target", "per_token", per_token)
    return [-per_token * abs(len(ids) - target) for ids in batch.response_ids]


def unfinished_penalty(batch: RewardBatch, *, penalty: float) -> list[float]:
    """``-penalty`` for a response cut at the length limit (no EOS), ``0`` for one that ended.

    Added to the other sources (the reward model's score of a cut response still counts), unlike
    PPO's ``reward.missing_eos_penalty``, which replaces that score and, where most responses are
    cut, gives most of them one reward. Use it where the reward (a judge or a reward model that
    reads a cut response with EOS appended) pays longer, unfinished text: a penalty about the size
    of that preference keeps PPO from learning to stop ending its turn.

    Args:
        batch: the responses; ``batch.ended`` says which ended with EOS.
        penalty: subtracted from each unfinished response's reward (>= 0).
    """
    _check_non_negative("unfinished_penalty", "penalty", penalty)
    return [0.0 if ended else -float(penalty) for ended in batch.ended]


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

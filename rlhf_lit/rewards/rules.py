"""Rule rewards checked against a column of the prompt data (verifiable rewards).

Each is a plain reward function ``fn(batch, *, params)`` (see :mod:`rlhf_lit.rewards.functions`)
that reads an extra column of the prompt dataset from ``batch.extras`` (the prompt data module's
``extra_fields``, e.g. ``[ground_truth]``) and returns 1.0 for a response that satisfies the rule,
else 0.0. ``configs/offline/verifiable.yaml`` trains with :func:`mentions_ground_truth` (docs/VERIFIABLE.md).
"""

from __future__ import annotations

import re

from rlhf_lit.callable_specs import resolve_callable
from rlhf_lit.rewards.functions import RewardBatch


def count_word(text: str, word: str) -> int:
    """How many times ``word`` occurs in ``text`` as a whole word (case-sensitive).

    A whole word: not preceded or followed by a letter, digit or underscore, so ``"Lily"`` counts in
    ``"Lily's"`` and ``"Lily."`` but not in ``"Lilyanne"``.
    """
    if not word:
        raise ValueError("count_word: the word must be a non-empty string")
    return len(re.findall(rf"(?<!\w){re.escape(word)}(?!\w)", text))


def mentions_ground_truth(batch: RewardBatch, *, column: str = "ground_truth", min_count: int = 1) -> list[float]:
    """1.0 when the decoded response names ``batch.extras[column][i]`` at least ``min_count``
    times as a whole word (case-sensitive, :func:`count_word`), else 0.0.

    Example: the prompt "... a little girl named Lily." with ``ground_truth = "Lily"``; the
    response " She liked Lily's hat." scores 1.0, " She went home." scores 0.0.

    Args:
        batch: the responses; the prompt is not searched.
        column: the extra column holding the word to find (one string per response).
        min_count: how many mentions the rule asks for (>= 1).

    Raises:
        ValueError: ``column`` is not among the batch's extras (add it to the prompt data module's
            ``extra_fields``), an entry is not a non-empty string, or ``min_count < 1``.
    """
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
        raise ValueError(f"mentions_ground_truth: min_count must be an int >= 1, got {min_count!r}")
    if column not in batch.extras:
        raise ValueError(
            f"mentions_ground_truth: the batch has no extra column {column!r} (it has {sorted(batch.extras)}); "
            f"add it to the prompt data module's extra_fields"
        )
    words = batch.extras[column]
    for i, word in enumerate(words):
        if not isinstance(word, str) or not word:
            raise ValueError(f"mentions_ground_truth: {column}[{i}] must be a non-empty string, got {word!r}")
    return [1.0 if count_word(text, word) >= min_count else 0.0 for text, word in zip(batch.responses, words)]


def judge_score(batch: RewardBatch, *, judge: str) -> list[float]:
    """A text judge used as a reward: ``judge(batch.responses)``, one score per response.

    A judge (``module:function`` of a list of response texts, e.g.
    ``rlhf_lit.evaluation.judges:vader``) only measures unless it is configured as a source this
    way: ``{name: vader, function: "rlhf_lit.rewards.rules:judge_score", kwargs: {judge:
    "rlhf_lit.evaluation.judges:vader"}}``. Its return value is checked like any reward's.
    """
    return resolve_callable(judge, "judge spec", "rlhf_lit.evaluation.judges:vader")(list(batch.responses))

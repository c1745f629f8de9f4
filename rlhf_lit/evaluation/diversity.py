"""Distinct-n (Li et al. 2016): how varied a set of generations is, and whether a fall comes from
responses repeating themselves or from responses growing alike (:func:`distinct_n_factors`)."""

from __future__ import annotations

from collections.abc import Sequence

from rlhf_lit.option_values import check_least


def ngrams(words: Sequence[str], n: int) -> list[tuple[str, ...]]:
    """The ``n``-grams of a word sequence, in order (none when it has fewer than ``n`` words)."""
    return [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]


def distinct_n(texts: Sequence[str], n: int) -> float:
    """Distinct n-grams over all n-grams, pooled across ``texts`` (corpus level).

    Words are whitespace-separated, case and punctuation kept (``"dog."`` differs from ``"dog"``).
    1.0 means no n-gram repeats anywhere in the set; a policy that collapses to one story scores
    near ``1 / len(texts)``. 0.0 when the texts hold no n-gram at all.
    """
    total, _, unique = _counts(texts, n)
    return unique / total if total else 0.0


def distinct_n_factors(texts: Sequence[str], n: int) -> tuple[float, float]:
    """Distinct-n split into two factors whose product is :func:`distinct_n`: ``(within, across)``.

    With T the n-grams of all texts, W the sum over texts of each text's own distinct n-grams and U
    the distinct n-grams of the whole set, distinct-n = U / T = (W / T) * (U / W):

    - ``within`` = W / T: 1.0 when no text repeats one of its own n-grams (a looping response
      lowers it);
    - ``across`` = U / W: 1.0 when no two texts share an n-gram (responses that converge on the
      same phrases, for every prompt, lower it).

    A policy tuned against a reward usually loses distinct-2 *across* responses (the demo's PPO keeps
    0.785 of SFT's across factor and 0.986 of its within factor, docs/ppo.md), which a per-response
    repetition penalty cannot fix.
    Both are 0.0 when the texts hold no n-gram at all.
    """
    total, own_distinct, unique = _counts(texts, n)
    if not total:
        return 0.0, 0.0
    return own_distinct / total, unique / own_distinct


def _counts(texts: Sequence[str], n: int) -> tuple[int, int, int]:
    """``(T, W, U)`` of :func:`distinct_n_factors`: the n-grams of all texts, the sum of each text's own
    distinct n-grams, and the distinct n-grams of the whole set."""
    check_least("n", n, 1)
    total, own_distinct, unique = 0, 0, set()
    for text in texts:
        own = ngrams(text.split(), n)
        total += len(own)
        own_distinct += len(set(own))
        unique.update(own)
    return total, own_distinct, len(unique)

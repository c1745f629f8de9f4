"""Distinct-n (Li et al. 2016): how varied a set of generations is."""

from __future__ import annotations

from collections.abc import Sequence


def ngrams(words: Sequence[str], n: int) -> list[tuple[str, ...]]:
    """The ``n``-grams of a word sequence, in order (none when it has fewer than ``n`` words)."""
    return [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]


def distinct_n(texts: Sequence[str], n: int) -> float:
    """Distinct n-grams over all n-grams, pooled across ``texts`` (corpus level).

    Words are whitespace-separated, case and punctuation kept (``"dog."`` differs from ``"dog"``).
    1.0 means no n-gram repeats anywhere in the set; a policy that collapses to one story scores
    near ``1 / len(texts)``. 0.0 when the texts hold no n-gram at all.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    total, unique = 0, set()
    for text in texts:
        grams = ngrams(text.split(), n)
        total += len(grams)
        unique.update(grams)
    return len(unique) / total if total else 0.0

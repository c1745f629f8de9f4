"""Distinct-n on hand-made texts, counts worked out by hand."""

from __future__ import annotations

import pytest

from rlhf_lit.evaluation.diversity import distinct_n, ngrams


def test_ngrams():
    assert ngrams(["a", "b", "c"], 2) == [("a", "b"), ("b", "c")]
    assert ngrams(["a"], 2) == []


def test_distinct_pooled_across_texts():
    texts = ["the cat sat", "the cat ran"]
    # unigrams: the cat sat the cat ran -> 6 in all, 4 distinct (the, cat, sat, ran)
    assert distinct_n(texts, 1) == 4 / 6
    # bigrams: (the cat) (cat sat) (the cat) (cat ran) -> 4 in all, 3 distinct
    assert distinct_n(texts, 2) == 3 / 4


def test_distinct_repetition():
    # "a a a a": 4 unigrams, 1 distinct; 3 bigrams (a a) x 3, 1 distinct
    assert distinct_n(["a a a a"], 1) == 1 / 4
    assert distinct_n(["a a a a"], 2) == 1 / 3


def test_distinct_keeps_case_and_punctuation():
    # "Dog dog dog." -> 3 distinct unigrams of 3
    assert distinct_n(["Dog dog dog."], 1) == 1.0


def test_distinct_without_ngrams():
    # "" has no words, "one" no bigram: 1 unigram in all, 0 bigrams
    assert distinct_n(["", "one"], 1) == 1.0
    assert distinct_n(["", "one"], 2) == 0.0
    assert distinct_n([], 1) == 0.0


def test_distinct_n_must_be_positive():
    with pytest.raises(ValueError, match="n must be >= 1"):
        distinct_n(["a b"], 0)

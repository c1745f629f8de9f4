"""Distinct-n and its within / across factors on hand-made texts, counts worked out by hand."""

from __future__ import annotations

import pytest

from rlhf_lit.evaluation.diversity import distinct_n, distinct_n_factors, ngrams


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


def test_factors_split_repetition_within_a_text_from_texts_alike():
    # "a b a b": bigrams (a b) (b a) (a b): 3, 2 distinct of its own; "a b c": (a b) (b c): 2, 2 of its own.
    # T = 5, W = 2 + 2 = 4, U = {(a b), (b a), (b c)} = 3: within 4/5, across 3/4, product 3/5 = distinct-2.
    texts = ["a b a b", "a b c"]
    assert distinct_n_factors(texts, 2) == (4 / 5, 3 / 4)
    assert distinct_n(texts, 2) == 3 / 5
    # Two copies of one text: nothing repeats within either, everything repeats across them.
    assert distinct_n_factors(["x y z", "x y z"], 2) == (1.0, 1 / 2)
    # One looping text: all the loss is within.
    assert distinct_n_factors(["a a a a"], 2) == (1 / 3, 1.0)


def test_factors_without_ngrams_and_n_checked():
    assert distinct_n_factors(["", "one"], 2) == (0.0, 0.0)
    assert distinct_n_factors([], 1) == (0.0, 0.0)
    with pytest.raises(ValueError, match="n must be >= 1"):
        distinct_n_factors(["a b"], 0)

"""The pure measurements of ``python -m demo diversity`` (:mod:`demo.diversity_study`): no model, no file.

- statistics: mean +- s.e. (:func:`stat`), within-prompt Spearman correlations, per-prompt means, lines
  read at a point with seeds resampled (:func:`line_at`);
- repetition edits of a response's last third (:func:`edited_texts`) and their effects;
- best-of-N picks by a score and the distinct-2 of the picks (:func:`selection`);
- distinct-2 relative to SFT's, split into its factors within and across responses (:func:`fall_factors`),
  and the n-grams whose count grew most (:func:`grown`);
- windows of a per-rollout curve (:func:`rollout_windows`) and the fall of entropy (:func:`entropy_fall`).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from demo.seeds_report import mean_se
from demo.story_prompts import opening_words
from rlhf_lit.evaluation import distinct_n, distinct_n_factors, ngrams

EDITS = ("loop2", "loop4", "dup", "loop4_neutral", "loop4_positive", "other")
"""The interventions, in the order of the report's table."""
MIN_WORDS = 12
"""Responses shorter than this are not edited: their last third would be too short to hold a loop."""
WINDOW = 5
"""Rollouts averaged at each point of an entropy curve (rollout 1 is read alone)."""
PUNCTUATION = ".,!?;:\"'()"
"""Stripped from a word's ends before looking it up in the VADER lexicon."""


# ------------------------------------------------------------------ statistics
def stat(values: Sequence[float | None]) -> dict | None:
    """``{"mean", "se", "n"}`` over the values that are not None (:func:`demo.seeds_report.mean_se`); None if none."""
    kept = [v for v in values if v is not None]
    if not kept:
        return None
    mean, se = mean_se(kept)
    return {"mean": mean, "se": se, "n": len(kept)}


def ranks(values: Sequence[float]) -> list[float]:
    """0-based ranks, tied values sharing their mean rank (what Spearman's correlation needs)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in order[i : j + 1]:
            out[k] = (i + j) / 2
        i = j + 1
    return out


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson's correlation; None when either side is constant."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    return None if sxx == 0 or syy == 0 else sxy / math.sqrt(sxx * syy)


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation (Pearson's of the ranks); None when either side is constant."""
    return pearson(ranks(xs), ranks(ys))


def within_prompt_spearman(ys: Sequence[float], xs: Sequence[float | None], prompt_of: Sequence[int]) -> dict | None:
    """Spearman of ``ys`` with ``xs`` among each prompt's responses, mean +- s.e. over prompts.

    Comparing responses of one prompt keeps the prompt's own effect (some openings invite happier
    stories) out. Responses whose ``x`` is None are left out; a prompt with fewer than 3 responses left,
    or a constant side, has no correlation (``n`` counts the prompts that have one).
    """
    by_prompt: dict[int, list[tuple[float, float]]] = {}
    for y, x, p in zip(ys, xs, prompt_of):
        if x is not None:
            by_prompt.setdefault(p, []).append((y, x))
    return stat(
        [
            spearman([y for y, _ in rows], [x for _, x in rows]) if len(rows) >= 3 else None
            for rows in by_prompt.values()
        ]
    )


def per_prompt(prompt_of: Sequence[int], values: Sequence[float]) -> dict | None:
    """Each prompt's mean of ``values``, then mean +- s.e. over prompts (a prompt counts once, whatever its rows)."""
    by_prompt: dict[int, list[float]] = {}
    for p, v in zip(prompt_of, values):
        by_prompt.setdefault(p, []).append(v)
    return stat([sum(v) / len(v) for v in by_prompt.values()])


def own_distinct(text: str, n: int) -> float | None:
    """A response's own distinct-n: its distinct n-grams over its n-grams (None when it has none)."""
    return distinct_n([text], n) if len(text.split()) >= n else None


def line_at(
    points_by_seed: Sequence[tuple[Sequence[float], Sequence[float]]], xs: Sequence[float], boot: int = 2000
) -> dict[str, dict | None]:
    """The least-squares line ``y = a + b x`` through every seed's ``(x, y)`` points, read at each of ``xs``.

    The s.e. refits the line on the seeds resampled with replacement ``boot`` times (crude with 3 seeds:
    optimistic). A point outside the range of the ``x`` values has no reading (None): no extrapolation.
    """
    import numpy as np

    def fit(groups):
        b, a = np.polyfit(np.concatenate([x for x, _ in groups]), np.concatenate([y for _, y in groups]), 1)
        return [a + b * x for x in xs]

    seeds, se = len(points_by_seed), [None] * len(xs)
    if seeds > 1:  # one seed: nothing to resample
        rng, boots = np.random.default_rng(0), []
        for _ in range(boot):
            groups = [points_by_seed[i] for i in rng.integers(0, seeds, seeds)]
            if np.ptp(np.concatenate([x for x, _ in groups])) > 0:  # every x equal: no line through them
                boots.append(fit(groups))
        se = np.std(boots, axis=0).tolist()
    low = min(min(x) for x, _ in points_by_seed)
    high = max(max(x) for x, _ in points_by_seed)
    return {
        str(x): {"mean": float(m), "se": s, "n": seeds} if low <= x <= high else None
        for x, m, s in zip(xs, fit(points_by_seed), se)
    }


# ------------------------------------------------------------------ 1. repetition: correlations and edits
def word_valence(lexicon: Mapping[str, float]) -> Callable[[str], float]:
    """A word's valence in a VADER-style lexicon: lower-cased, :data:`PUNCTUATION` stripped, 0 when absent."""
    return lambda word: lexicon.get(word.lower().strip(PUNCTUATION), 0.0)


def loop(words: Sequence[str], start: int, width: int, length: int) -> list[str]:
    """``words[start:start + width]`` repeated to ``length`` words (the last repeat cut short)."""
    return (list(words[start : start + width]) * length)[:length]


def edit_tails(
    words: Sequence[str], rng: random.Random, valence: Callable[[str], float]
) -> dict[str, list[str] | None]:
    """The new last third (``len(words) // 3`` words) of a response for every edit but ``other``.

    Loops repeat a phrase of the first two thirds, at a random start; ``loop4_positive`` /
    ``loop4_neutral`` take the first phrase (starts shuffled) holding a positive word / no word of
    the lexicon at all, None when there is none. ``rng`` is called in a fixed order (a bigram's start,
    a phrase's start, the shuffle), so one seed gives the same edits everywhere.
    """
    length = len(words) // 3
    cut = len(words) - length
    tails: dict[str, list[str] | None] = {
        "loop2": loop(words, rng.randrange(0, cut - 1), 2, length),
        "loop4": loop(words, rng.randrange(0, cut - 3), 4, length),
        "dup": list(words[cut - length : cut]),
    }
    starts = list(range(cut - 3))
    rng.shuffle(starts)
    positive = next((j for j in starts if any(valence(w) > 0 for w in words[j : j + 4])), None)
    neutral = next((j for j in starts if all(valence(w) == 0 for w in words[j : j + 4])), None)
    tails["loop4_positive"] = None if positive is None else loop(words, positive, 4, length)
    tails["loop4_neutral"] = None if neutral is None else loop(words, neutral, 4, length)
    return tails


def edited_texts(
    responses: Sequence[str], prompt_of: Sequence[int], rng: random.Random, valence: Callable[[str], float]
) -> tuple[list[int], dict[str, list[str | None]]]:
    """``(rows, texts)``: the responses edited (>= :data:`MIN_WORDS` words) and each edit's text per row.

    An edited text keeps the first two thirds of the response as written (its spacing) and replaces the
    rest (:func:`edit_tails`); ``other`` takes the last words of a random response to another prompt.
    A text is None where its edit found no phrase.
    """
    if len(set(prompt_of)) < 2:
        raise ValueError("the 'other' edit needs responses to at least two prompts")
    rows, texts = [], {name: [] for name in EDITS}
    words_of = [response.split() for response in responses]
    for i, (response, words) in enumerate(zip(responses, words_of)):
        if len(words) < MIN_WORDS:
            continue
        length = len(words) // 3
        tails = edit_tails(words, rng, valence)
        if not any(prompt_of[j] != prompt_of[i] and len(w) >= length for j, w in enumerate(words_of)):
            raise ValueError(
                f"no response to another prompt has the {length} words the 'other' edit of response {i} needs"
            )
        while True:  # a donor of another prompt, long enough (one exists: checked above)
            other = rng.randrange(len(responses))
            if prompt_of[other] != prompt_of[i] and len(words_of[other]) >= length:
                break
        tails["other"] = words_of[other][-length:]
        head = opening_words(response, len(words) - length)
        rows.append(i)
        for name in EDITS:
            texts[name].append(None if tails[name] is None else f"{head} {' '.join(tails[name])}")
    return rows, texts


def edit_effects(
    prompt_of: Sequence[int],
    rm_change: Sequence[float],
    judge_change: Sequence[float],
    distinct2_change: Sequence[float],
) -> dict:
    """One edit's changes (RM and judge already in std units), each averaged per prompt then over prompts."""
    return {
        "d_rm_z": per_prompt(prompt_of, rm_change),
        "d_judge_z": per_prompt(prompt_of, judge_change),
        "d_rm_minus_d_judge_z": per_prompt(prompt_of, [r - j for r, j in zip(rm_change, judge_change)]),
        "d_distinct2_within": per_prompt(prompt_of, distinct2_change),
        "n_responses": len(rm_change),
    }


# ------------------------------------------------------------------ 2. best-of-N by the RM and by the judge
def best_of_n_picks(samples_by_prompt: Sequence[Sequence[Mapping]], n: int, key: str) -> list[list[Mapping]]:
    """Best-of-``n`` by ``key`` from every disjoint subset of ``n`` samples: one list of picks (one per prompt)
    per subset, subset ``j`` holding each prompt's samples ``j*n .. j*n + n - 1``. On a tie the sample drawn
    first wins (``max`` keeps the first), as ``rlhf-lit best-of-n`` picks."""
    subsets = min(len(samples) for samples in samples_by_prompt) // n
    return [
        [max(samples[j * n : (j + 1) * n], key=lambda s: s[key]) for samples in samples_by_prompt]
        for j in range(subsets)
    ]


def _measure_picks(picks: Sequence[Mapping]) -> dict[str, float]:
    """distinct-2 of the picked responses, its two factors, and their mean judge and RM scores."""
    texts = [p["response"] for p in picks]
    within, across = distinct_n_factors(texts, 2)
    return {
        "d2": distinct_n(texts, 2),
        "within": within,
        "across": across,
        "judge": sum(p["judge"] for p in picks) / len(picks),
        "rm": sum(p["rm"] for p in picks) / len(picks),
    }


def selection(samples_by_prompt: Sequence[Sequence[Mapping]], ns: Sequence[int]) -> dict[str, dict]:
    """Best-of-N picked by the RM (``rm``) and by the judge (``judge``) at each N of ``ns``.

    Per N and picker, over the disjoint subsets (:func:`best_of_n_picks`): distinct-2, within and across
    of the picks relative to N = 1's (every sample, the same pool of texts per subset), mean judge and RM
    score; and the RM's distinct-2 ratio minus the judge's, paired over subsets (same samples to pick from).
    """
    base = [_measure_picks(p) for p in best_of_n_picks(samples_by_prompt, 1, "rm")]
    base_mean = {k: sum(m[k] for m in base) / len(base) for k in ("d2", "within", "across")}
    out = {}
    for n in ns:
        measured = {
            key: [_measure_picks(p) for p in best_of_n_picks(samples_by_prompt, n, key)] for key in ("rm", "judge")
        }
        out[str(n)] = {
            key: {
                "d2_ratio": stat([m["d2"] / base_mean["d2"] for m in rows]),
                "within_ratio": stat([m["within"] / base_mean["within"] for m in rows]),
                "across_ratio": stat([m["across"] / base_mean["across"] for m in rows]),
                "judge": stat([m["judge"] for m in rows]),
                "rm": stat([m["rm"] for m in rows]),
            }
            for key, rows in measured.items()
        }
        out[str(n)]["d2_ratio_rm_minus_judge"] = stat(
            [(r["d2"] - j["d2"]) / base_mean["d2"] for r, j in zip(measured["rm"], measured["judge"])]
        )
    return {"base_distinct2": base_mean["d2"], "by_n": out}


# ------------------------------------------------------------------ 3. where the fall is
def fall_factors(texts: Sequence[str], sft: tuple[float, float]) -> dict[str, float | None]:
    """distinct-2 of ``texts`` and its factors (:func:`~rlhf_lit.evaluation.distinct_n_factors`) over SFT's
    ``(within, across)``, and the share of ``log(d2 ratio)`` each factor holds (None without a fall).

    distinct-2 = within x across, so the log of its ratio to SFT's is the sum of the factors' log ratios:
    the shares add up to 1.
    """
    within, across = distinct_n_factors(texts, 2)
    if not within * across or not sft[0] * sft[1]:
        raise ValueError("distinct-2 is 0 (no bigram, or every bigram the same): no ratio to SFT's to split")
    ratios = {
        "d2_ratio": within * across / (sft[0] * sft[1]),
        "within_ratio": within / sft[0],
        "across_ratio": across / sft[1],
    }
    fall = math.log(ratios["d2_ratio"])
    return {
        **ratios,
        "share_within": math.log(ratios["within_ratio"]) / fall if fall else None,
        "share_across": math.log(ratios["across_ratio"]) / fall if fall else None,
    }


def grown(runs: Sequence[Sequence[str]], sft: Sequence[str], n: int, top: int = 15) -> dict:
    """The ``top`` n-grams whose count grew most from ``sft`` to the policy (each of ``runs`` an evaluation of
    as many responses as ``sft``; count per run, mean over runs), and their share of all n-grams in both."""
    counts = Counter(g for texts in runs for text in texts for g in ngrams(text.split(), n))
    base = Counter(g for text in sft for g in ngrams(text.split(), n))
    most = sorted(counts, key=lambda g: counts[g] / len(runs) - base[g], reverse=True)[:top]
    return {
        "ngrams": [{"ngram": " ".join(g), "per_run": counts[g] / len(runs), "sft": base[g]} for g in most],
        "share": sum(counts[g] for g in most) / sum(counts.values()),
        "share_sft": sum(base[g] for g in most) / sum(base.values()),
    }


def repeats_a_word(texts: Sequence[str], times: int = 3) -> float:
    """The fraction of ``texts`` that use some word ``times`` times or more (a story circling one word)."""
    return sum(max(Counter(t.split()).values(), default=0) >= times for t in texts) / len(texts)


# ------------------------------------------------------------------ 4. entropy over rollouts
def rollout_windows(values: Sequence[float], width: int = WINDOW) -> dict[str, float]:
    """A per-rollout curve (rollout 1 first) read at rollout 1 (alone), every 10th rollout and the last:
    the mean of the ``width`` rollouts ending there (one rollout is noisy)."""
    if not values:
        raise ValueError("no rollouts to read")
    ends = [1, *range(10, len(values) + 1, 10)]
    ends += [len(values)] if len(values) not in ends else []
    windows = {r: values[max(0, r - width) : r] for r in ends}
    return {str(r): sum(window) / len(window) for r, window in windows.items()}


def entropy_fall(entropy: Sequence[float], kl: Sequence[float], width: int = WINDOW) -> tuple[float, float]:
    """``(fall, fall per nat)``: mean entropy of the first ``width`` rollouts minus that of the last ``width``,
    and that fall over the mean KL of the last ``width`` rollouts (a policy that moved further may lose more)."""
    if min(len(entropy), len(kl)) < width:
        raise ValueError(f"the entropy fall needs {width} rollouts or more, got {min(len(entropy), len(kl))}")
    fall = sum(entropy[:width]) / width - sum(entropy[-width:]) / width
    return fall, fall / (sum(kl[-width:]) / width)

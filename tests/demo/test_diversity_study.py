"""The diversity study's measurements on hand-made inputs (every expected value worked out in a comment), and
the command end to end on a fake demo and seeds folder with the model-bound part stubbed: no model, no sampling."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import demo.report
from demo import diversity_study
from demo.diversity_measures import (
    EDITS,
    best_of_n_picks,
    edit_effects,
    edit_tails,
    edited_texts,
    entropy_fall,
    fall_factors,
    grown,
    line_at,
    loop,
    own_distinct,
    per_prompt,
    ranks,
    repeats_a_word,
    rollout_windows,
    selection,
    spearman,
    stat,
    within_prompt_spearman,
    word_valence,
)


class ScriptedRng:
    """Stands in for ``random.Random``: ``randrange`` answers from a script (recording its range), ``shuffle`` reverses."""

    def __init__(self, answers):
        self.answers, self.calls = list(answers), []

    def randrange(self, start, stop=None):
        self.calls.append((start, stop))
        return self.answers.pop(0)

    def shuffle(self, values):
        values.reverse()


# ------------------------------------------------------------------ statistics
def test_stat_drops_missing_values_and_uses_the_sample_std():
    # 1 and 3: mean 2, sample variance (1 + 1) / 1 = 2, se = sqrt(2 / 2) = 1; the None is not a value.
    assert stat([1.0, None, 3.0]) == {"mean": 2.0, "se": 1.0, "n": 2}
    assert stat([0.5]) == {"mean": 0.5, "se": None, "n": 1}
    assert stat([None]) is None


def test_ranks_share_ties_and_spearman_is_pearson_of_the_ranks():
    assert ranks([10, 20, 10, 30]) == [0.5, 2.0, 0.5, 3.0]  # the two 10s share ranks 0 and 1
    assert spearman([1, 2, 3, 4], [1, 5, 9, 100]) == pytest.approx(1.0)  # monotone, not linear: still 1
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # x ranks 0 1 2, y ranks 0.5 0.5 2 (tie): deviations (-1, 0, 1) and (-0.5, -0.5, 1):
    # sxy = 0.5 + 0 + 1 = 1.5, sxx = 2, syy = 1.5 -> 1.5 / sqrt(3) = sqrt(3) / 2.
    assert spearman([1, 2, 3], [1, 1, 2]) == pytest.approx(math.sqrt(3) / 2)
    assert spearman([1, 2, 3], [7, 7, 7]) is None  # a constant side has no correlation


def test_within_prompt_spearman_compares_responses_of_one_prompt_only():
    # Prompt 0: score falls as x rises (-1). Prompt 1: the same, 10 higher on both sides (-1). Pooled, the
    # prompt's own level would win: ranks of x (2 1 0 5 4 3) against 0..5 give +9.5 / 17.5 = +0.54.
    ys, xs, prompts = [0, 1, 2, 10, 11, 12], [2, 1, 0, 12, 11, 10], [0, 0, 0, 1, 1, 1]
    assert spearman(ys, xs) == pytest.approx(9.5 / 17.5)
    assert within_prompt_spearman(ys, xs, prompts) == {"mean": pytest.approx(-1.0), "se": pytest.approx(0.0), "n": 2}
    # Prompt 2: x ranks (0 2 1) against (0 1 2): deviations (-1 1 0), (-1 0 1) -> 1 / 2 = 0.5, its None left out.
    # Prompt 3: two responses, too few. Prompt 4: x constant, none. Mean of (-1, -1, 0.5) = -0.5,
    # deviations (-0.5, -0.5, 1): sample variance 1.5 / 2 = 0.75, se = sqrt(0.75 / 3) = 0.5.
    ys += [1, 2, 3, 9, 1, 2, 3, 4, 5]
    xs += [1, 3, 2, None, 5, 6, 1, 1, 1]
    prompts += [2, 2, 2, 2, 3, 3, 4, 4, 4]
    assert within_prompt_spearman(ys, xs, prompts) == {"mean": pytest.approx(-0.5), "se": pytest.approx(0.5), "n": 3}


def test_per_prompt_weighs_each_prompt_once():
    # Prompt 0's rows 1 2 3 average 2, prompt 1's one row 6: mean over prompts 4 (the rows' mean would be 3),
    # se = |6 - 2| / 2 = 2.
    assert per_prompt([0, 0, 0, 1], [1.0, 2.0, 3.0, 6.0]) == {"mean": 4.0, "se": 2.0, "n": 2}


def test_edit_effects_average_per_prompt_and_subtract_the_judge_from_the_rm():
    # RM changes per prompt: (1 + 3) / 2 = 2 and -1 -> mean 0.5, se |2 + 1| / 2 = 1.5. Judge: 1 and 1 -> 1, se 0.
    # RM minus judge per row (1, 1, -2): prompt means 1 and -2 -> -0.5, se 1.5.
    e = edit_effects([0, 0, 1], [1.0, 3.0, -1.0], [0.0, 2.0, 1.0], [-0.2, -0.4, 0.0])
    assert e["d_rm_z"] == {"mean": 0.5, "se": 1.5, "n": 2}
    assert e["d_judge_z"] == {"mean": 1.0, "se": 0.0, "n": 2}
    assert e["d_rm_minus_d_judge_z"] == {"mean": -0.5, "se": 1.5, "n": 2}
    assert e["d_distinct2_within"]["mean"] == pytest.approx((-0.3 + 0.0) / 2)
    assert e["n_responses"] == 3


def test_line_at_reads_the_fitted_line_inside_the_data_only():
    # Both seeds lie on y = 1 + 2x: read at 1.5 it is 4 whatever seeds are resampled (se 0); 5 is beyond x = 3.
    at = line_at([([0.0, 1.0], [1.0, 3.0]), ([2.0, 3.0], [5.0, 7.0])], (1.5, 5.0), boot=50)
    assert at["1.5"] == {"mean": pytest.approx(4.0), "se": pytest.approx(0.0, abs=1e-12), "n": 2}
    assert at["5.0"] is None
    # Seeds on y = x and y = x + 2 (x 0 and 1 each): pooled line y = 1 + x, 1.5 at x = 0.5; resampling the
    # seeds gives 0.5, 1.5 or 2.5 there, so the se is > 0. One seed: no se.
    assert line_at([([0, 1], [0, 1]), ([0, 1], [2, 3])], (0.5,), boot=50)["0.5"]["mean"] == pytest.approx(1.5)
    assert line_at([([0, 1], [0, 1]), ([0, 1], [2, 3])], (0.5,), boot=50)["0.5"]["se"] > 0.1
    assert line_at([([0, 1], [0, 1])], (0.5,))["0.5"] == {"mean": pytest.approx(0.5), "se": None, "n": 1}


# ------------------------------------------------------------------ 1. repetition edits
HAPPY = "Tom was happy and he ran to the park with his dog"
"""12 words, 11 bigrams all distinct (own distinct-2 1.0): the last third is 4 words, the cut after "the"."""


def test_own_distinct_counts_one_response():
    assert own_distinct("a b a b", 2) == pytest.approx(2 / 3)  # bigrams ab ba ab: 2 distinct of 3
    assert own_distinct("a b a b", 1) == pytest.approx(2 / 4)
    assert own_distinct("one", 2) is None  # no bigram at all
    assert own_distinct(HAPPY, 2) == 1.0


def test_word_valence_reads_the_lexicon_as_vader_does():
    valence = word_valence({"happy": 2.7})
    assert valence("Happy!") == 2.7 and valence("happy.") == 2.7
    assert valence("dog") == 0.0


def test_loop_repeats_a_phrase_to_the_length():
    assert loop(["a", "b", "c", "d"], 1, 2, 5) == ["b", "c", "b", "c", "b"]


def test_edits_keep_the_word_count_and_lower_own_distinct2_by_the_repeated_bigrams():
    # Script: loop2 starts at word 2, loop4 at word 1, the first donor (row 0, the same prompt) is refused, row 1 taken.
    rng = ScriptedRng([2, 1, 0, 1])
    donor = "and then they all went home"  # prompt 1; 6 words: too short to be edited itself
    rows, texts = edited_texts(["  " + HAPPY, donor], [0, 1], rng, word_valence({"happy": 2.7}))
    assert rows == [0]
    # A bigram start must leave the bigram in the first 8 words (randrange(0, 7)), a phrase's likewise (0, 5).
    assert rng.calls == [(0, 7), (0, 5), (2, None), (2, None)]
    head = "  Tom was happy and he ran to the"  # the first two thirds as written, leading spaces kept
    assert texts["loop2"] == [head + " happy and happy and"]
    assert texts["other"] == [head + " they all went home"]
    for name in EDITS:
        assert len(texts[name][0].split()) == 12, name
    # loop2 adds "the happy" and "and happy" to the 7 bigrams of the head, repeats "happy and" twice: 9 / 11.
    # loop4 (was happy and he), dup (he ran to the) and loop4_neutral (he ran to the) add one new bigram
    # each: 8 / 11. loop4_positive (happy and he ran) likewise. other's 4 bigrams are all new: 11 / 11.
    expected = {"loop2": 9, "loop4": 8, "dup": 8, "loop4_neutral": 8, "loop4_positive": 8, "other": 11}
    for name, distinct in expected.items():
        assert own_distinct(texts[name][0], 2) - 1.0 == pytest.approx(distinct / 11 - 1.0), name


def test_the_positive_loop_repeats_a_lexicon_word_and_the_neutral_loop_none():
    valence = word_valence({"happy": 2.7})
    words = HAPPY.split()
    # Phrase starts 0..4, shuffled (reversed here) to 4 3 2 1 0: the first holding "happy" starts at 2, the
    # first without any lexicon word at 4.
    tails = edit_tails(words, ScriptedRng([0, 0]), valence)
    assert tails["loop4_positive"] == ["happy", "and", "he", "ran"]
    assert tails["loop4_neutral"] == ["he", "ran", "to", "the"]
    assert tails["dup"] == ["he", "ran", "to", "the"]  # words 4-7, the span just before the cut
    # No positive word in the head: that edit has no text (the row is left out of its mean).
    assert edit_tails(words, ScriptedRng([0, 0]), word_valence({"dog": 1.0}))["loop4_positive"] is None


def test_edited_texts_needs_two_prompts():
    with pytest.raises(ValueError, match="two prompts"):
        edited_texts([HAPPY, HAPPY], [0, 0], ScriptedRng([]), word_valence({}))


# ------------------------------------------------------------------ 2. best-of-N by RM and by judge
def _samples(rows):
    return [{"response": r, "rm": rm, "judge": j} for r, rm, j in rows]


TABLE = [
    _samples(
        [("the cat sat", 0.1, 0.9), ("a happy day", 0.5, 0.2), ("a happy dog", 0.3, 0.3), ("a happy hat", 0.3, 0.1)]
    ),
    _samples(
        [("a happy day", 0.7, 0.0), ("one red ball", 0.2, 0.8), ("we sang songs", 0.0, 0.6), ("a happy hat", 0.9, 0.5)]
    ),
]
"""2 prompts x 4 samples: the RM likes "a happy ..." stories, the judge others; prompt 0's samples 2 and 3 tie on RM."""


def test_best_of_n_picks_the_highest_score_in_each_subset_first_drawn_on_a_tie():
    by_rm = best_of_n_picks(TABLE, 2, "rm")
    # Subset 0: 0.5 > 0.1 and 0.7 > 0.2. Subset 1: 0.3 = 0.3, the first drawn wins; 0.9 > 0.0.
    assert [[p["response"] for p in picks] for picks in by_rm] == [
        ["a happy day", "a happy day"],
        ["a happy dog", "a happy hat"],
    ]
    by_judge = best_of_n_picks(TABLE, 2, "judge")
    assert [[p["response"] for p in picks] for picks in by_judge] == [
        ["the cat sat", "one red ball"],
        ["a happy dog", "we sang songs"],
    ]


def test_selection_measures_distinct2_of_the_picks_against_n_1():
    result = selection(TABLE, [2])
    # N = 1, one sample per prompt: subsets 0-2 share no bigram (1.0); subset 3 is "a happy hat" twice (2 / 4):
    # base (1 + 1 + 1 + 0.5) / 4 = 0.875.
    assert result["base_distinct2"] == pytest.approx(0.875)
    rm, judge = result["by_n"]["2"]["rm"], result["by_n"]["2"]["judge"]
    # By RM: "a happy day" twice 2 / 4 = 0.5, then "a happy dog" + "a happy hat" 3 / 4: ratios 4/7 and 6/7,
    # mean 5/7, se (6/7 - 4/7) / 2 = 1/7. Every pick repeats none of its own bigrams: within 1.
    assert rm["d2_ratio"] == {"mean": pytest.approx(5 / 7), "se": pytest.approx(1 / 7), "n": 2}
    assert rm["within_ratio"]["mean"] == pytest.approx(1.0)
    assert rm["across_ratio"]["mean"] == pytest.approx(5 / 7)
    assert rm["judge"]["mean"] == pytest.approx(((0.2 + 0.0) / 2 + (0.3 + 0.5) / 2) / 2)  # 0.25
    # By judge: no shared bigram in either subset, 8/7 each; its picks' judge (0.85 + 0.45) / 2 = 0.65.
    assert judge["d2_ratio"] == {"mean": pytest.approx(8 / 7), "se": pytest.approx(0.0), "n": 2}
    assert judge["judge"]["mean"] == pytest.approx(0.65)
    # Paired: (0.5 - 1) / 0.875 = -4/7 and (0.75 - 1) / 0.875 = -2/7 -> -3/7, se 1/7.
    assert result["by_n"]["2"]["d2_ratio_rm_minus_judge"] == {
        "mean": pytest.approx(-3 / 7),
        "se": pytest.approx(1 / 7),
        "n": 2,
    }


# ------------------------------------------------------------------ 3. where the fall is
def test_fall_factors_split_the_log_fall_between_within_and_across():
    # "a b c" and "a b d": 4 bigrams, 4 distinct within the responses, 3 in the set ("a b" shared):
    # within 1, across 3/4: the whole fall is across.
    f = fall_factors(["a b c", "a b d"], (1.0, 1.0))
    assert (f["d2_ratio"], f["within_ratio"], f["across_ratio"]) == pytest.approx((0.75, 1.0, 0.75))
    assert (f["share_within"], f["share_across"]) == pytest.approx((0.0, 1.0))
    # "a b a b" and "a b c": T = 5 bigrams, W = 2 + 2 = 4, U = 3 -> within 0.8, across 0.75, d2 0.6; against an
    # SFT of (0.9, 0.8) the ratios are 0.6 / 0.72, 0.8 / 0.9 and 0.75 / 0.8; the log shares add up to 1.
    f = fall_factors(["a b a b", "a b c"], (0.9, 0.8))
    assert (f["d2_ratio"], f["within_ratio"], f["across_ratio"]) == pytest.approx((0.6 / 0.72, 0.8 / 0.9, 0.75 / 0.8))
    assert f["share_within"] == pytest.approx(math.log(0.8 / 0.9) / math.log(0.6 / 0.72))
    assert f["share_within"] + f["share_across"] == pytest.approx(1.0)
    assert fall_factors(["a b c"], (1.0, 1.0))["share_across"] is None  # no fall, no share


def test_grown_ranks_ngrams_by_their_growth_per_run():
    runs = [["x y x y", "p q"], ["x y", "p q"]]
    # Per run: "x y" (2 + 1) / 2 = 1.5, "y x" 0.5, "p q" 1.0; SFT has "p q" once: growth 1.5, 0.5, 0.
    g = grown(runs, ["p q", "r s"], 2, top=2)
    assert g["ngrams"] == [{"ngram": "x y", "per_run": 1.5, "sft": 0}, {"ngram": "y x", "per_run": 0.5, "sft": 0}]
    assert g["share"] == pytest.approx(4 / 6)  # 3 + 1 of the runs' 6 bigrams
    assert g["share_sft"] == 0.0


def test_repeats_a_word_counts_responses_with_a_word_three_times():
    assert repeats_a_word(["a a a b", "a b a c", ""]) == pytest.approx(1 / 3)


# ------------------------------------------------------------------ 4. entropy
def test_rollout_windows_average_the_rollouts_ending_at_each_point():
    values = [float(r) for r in range(1, 13)]  # rollout r logged r
    # Rollout 1 alone; 10: mean of 6..10 = 8; the last, 12: mean of 8..12 = 10.
    assert rollout_windows(values) == {"1": 1.0, "10": 8.0, "12": 10.0}


def test_entropy_fall_is_first_window_minus_last_and_per_nat_of_the_last_kl():
    entropy = [2.0] * 5 + [1.5] + [1.0] * 5
    kl = [0.0] * 6 + [2.0] * 5
    assert entropy_fall(entropy, kl) == pytest.approx((1.0, 0.5))  # 2 - 1, over a KL of 2


# ------------------------------------------------------------------ the command, models stubbed
def _write(path, value):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value), encoding="utf-8")


def _evaluation(responses, kl, judge):
    return {"metrics": {"kl_mean": kl, "judge_mean": judge}, "samples": [{"response": r} for r in responses]}


def test_the_command_writes_every_section_from_a_demo_and_a_seeds_folder(tmp_path, monkeypatch, capsys):
    demo_dir, study, out = tmp_path / "demo", tmp_path / "seeds", tmp_path / "out"
    for model in ("sft/model", "reward_model/model"):
        (demo_dir / model).mkdir(parents=True)
    _write(demo_dir / "eval" / "sft.json", _evaluation(["a b c", "d e f"], 0.0, 0.1))
    samples = [{**s, "prompt_index": p, "sample_index": i} for p, rows in enumerate(TABLE) for i, s in enumerate(rows)]
    _write(
        demo_dir / "best_of_n" / "best_of_n.json",
        {"samples": samples, "rows": [{"n": 1, "kl_analytic": 0.0}, {"n": 2, "kl_analytic": math.log(2) - 0.5}]},
    )
    _write(study / "study.json", {"ppo": {"raw": {}}, "dpo": {"beta_0.1": {}}})
    for seed in (0, 1):
        run = study / "raw" / f"seed_{seed}"
        _write(run / "eval_rollout_10.json", _evaluation(["a b c", "a b d"], 1.0 + seed, 0.5))
        _write(run / "eval.json", _evaluation(["a b a b", "a b c"], 2.0 + seed, 0.7 + seed / 10))
        _write(study / "dpo" / "beta_0.1" / f"seed_{seed}" / "eval.json", _evaluation(["a b", "c d"], 1.0, 0.6))
    curves = {
        "objective/entropy": ([], [1.5 - r / 100 for r in range(12)]),
        "objective/kl": ([], [r / 4 for r in range(12)]),
    }
    monkeypatch.setattr(demo.report, "read_scalars", lambda run_dir: curves)
    effects = edit_effects([0, 1], [0.5, 0.1], [0.4, 0.2], [-0.2, -0.1])
    correlation = {
        f"{s}_vs_{x}": stat([0.1, 0.2])
        for s in ("rm", "judge")
        for x in ("distinct2_within", "distinct1_within", "words")
    }
    canned = {
        "samples": {
            "responses": 4,
            "prompts": 2,
            "k": 2,
            "sampling_seconds": 0.0,
            "words_mean": 3.0,
            "distinct2_within_mean": 1.0,
            "fraction_repeating_a_bigram": 0.0,
            "rm_std": 1.0,
            "judge_std": 0.5,
            "rescored_rm_correlation": 0.99,
        },
        "correlation": {**correlation, "rm_vs_judge": stat([0.7, 0.8])},
        "intervention": {"edited_responses": 2, "edits": {name: effects for name in EDITS}},
    }
    monkeypatch.setattr(diversity_study, "repetition", lambda *args: canned)

    argv = ["--demo", str(demo_dir), "--study", str(study), "--out", str(out)]
    assert diversity_study.main(argv) == 0
    result = json.loads((out / "diversity.json").read_text(encoding="utf-8"))
    raw = result["decomposition"]["variants"]["raw"]
    assert list(raw["checkpoints"]) == ["10", "final"]  # rollouts in order, the export last
    # SFT's "a b c" / "d e f": within 1, across 1; the final evaluations: d2 0.6 = 0.8 x 0.75 (above).
    assert raw["checkpoints"]["final"]["d2_ratio"]["mean"] == pytest.approx(0.6)
    assert raw["checkpoints"]["final"]["kl"] == {"mean": 2.5, "se": 0.5, "n": 2}
    assert list(result["entropy"]) == ["raw"]  # DPO has no rollouts
    assert result["entropy"]["raw"]["windows"]["10"]["mean"] == pytest.approx(1.5 - 7 / 100)  # rollouts 6-10
    assert result["best_of_n"]["by_n"]["2"]["kl_analytic"] == pytest.approx(math.log(2) - 0.5)
    md = (out / "diversity.md").read_text(encoding="utf-8")
    assert "| dpo/beta_0.1 | final | 2 |" in md and "| loop4_positive |" in md
    assert md in capsys.readouterr().out
    # The folder is the study's now: a rerun writes into it, a foreign folder is refused.
    assert diversity_study.main(argv) == 0
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    assert diversity_study.main([*argv[:4], "--out", str(tmp_path / "foreign")]) == 2


def test_repetition_pairs_each_edit_with_its_own_response_and_prompt(monkeypatch):
    """Section 1 with the models stubbed: an RM and a judge that are functions of the text (the RM of its prompt
    too), so every change the study reports can be recomputed here, response by response, from the edited texts
    (the same seed draws the same edits). Pairing an edit with another response's score, or a response with
    another prompt, changes the numbers."""
    import random
    import types

    import rlhf_lit.evaluation.judges as judges
    import rlhf_lit.evaluation.samples as samples_module

    words = "the cat was happy and the dog ran to the park with a big red ball".split()  # 15 words
    # 2 prompts x k = 3, all >= 12 words, each scored differently by both (more or fewer "happy", longer)
    responses = [" ".join(words[i:] + words[:i] + ["happy"] * (i % 3) + ["yes"] * i) for i in range(6)]
    prompts = ["Once upon", "One day"]

    def rm(prompt: str, response: str) -> float:  # depends on the prompt: a response paired with the wrong one shows
        return response.count("happy") * 2.0 + len(set(response.split())) * 0.1 + (prompt == "One day") * 5.0

    def judge(texts):
        return [t.count("happy") + 0.01 * len(t) for t in texts]

    repeated = [p for p in prompts for _ in range(3)]
    sampled = types.SimpleNamespace(
        responses=responses, prompts=repeated, rm_scores=[rm(p, r) for p, r in zip(repeated, responses)]
    )
    monkeypatch.setattr(diversity_study, "load_prompts", lambda *args: (None, prompts))
    monkeypatch.setattr(samples_module, "load_models", lambda *args, **kwargs: types.SimpleNamespace(prompts=repeated))
    monkeypatch.setattr(samples_module, "sample_and_measure", lambda *args, **kwargs: (sampled, 1.0))
    monkeypatch.setattr(judges, "load_judge", lambda spec: judge)
    monkeypatch.setattr(diversity_study, "rm_scores_of", lambda models, ps, rs: [rm(p, r) for p, r in zip(ps, rs)])

    result = diversity_study.repetition(Path("demo-folder"), "", 2, 3, 7, 48)

    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    rm_std = math.sqrt(sum((x - sum(sampled.rm_scores) / 6) ** 2 for x in sampled.rm_scores) / 6)  # population std
    judged = judge(responses)
    judge_std = math.sqrt(sum((x - sum(judged) / 6) ** 2 for x in judged) / 6)
    rows, edited = edited_texts(
        responses, [0, 0, 0, 1, 1, 1], random.Random(7), word_valence(SentimentIntensityAnalyzer().lexicon)
    )
    assert rows == list(range(6))

    def per_prompt_then_over_prompts(changes: dict[int, float]) -> float:  # row -> change
        by_prompt = [[c for i, c in changes.items() if i // 3 == prompt] for prompt in (0, 1)]
        means = [sum(v) / len(v) for v in by_prompt if v]
        return sum(means) / len(means)

    for name in EDITS:
        kept = {i: text for i, text in zip(rows, edited[name]) if text is not None}
        d_rm = {i: (rm(repeated[i], t) - rm(repeated[i], responses[i])) / rm_std for i, t in kept.items()}
        d_judge = {i: (judge([t])[0] - judged[i]) / judge_std for i, t in kept.items()}
        got = result["intervention"]["edits"][name]
        assert got["d_rm_z"]["mean"] == pytest.approx(per_prompt_then_over_prompts(d_rm)), name
        assert got["d_judge_z"]["mean"] == pytest.approx(per_prompt_then_over_prompts(d_judge)), name
    assert result["samples"]["rescored_rm_correlation"] == pytest.approx(1.0)


def test_the_measures_refuse_inputs_they_cannot_read():
    import random

    with pytest.raises(ValueError, match="the 'other' edit of response 0 needs"):  # no donor long enough
        edited_texts(["a b c d e f g h i j k l m n o", "x"], [0, 1], random.Random(0), lambda w: 0.0)
    with pytest.raises(ValueError, match="distinct-2 is 0"):
        fall_factors(["one"], (0.9, 0.8))
    with pytest.raises(ValueError, match="no rollouts"):
        rollout_windows([])
    with pytest.raises(ValueError, match="5 rollouts or more, got 3"):
        entropy_fall([1.0, 0.9, 0.8], [0.1, 0.2, 0.3])

"""The best and the worst of N samples per prompt, as the pairs BoNBoN trains on."""

import pytest

from rlhf_lit.evaluation.best_of_n_pairs import best_and_worst, best_worst_pairs


def test_best_and_worst_break_ties_to_the_first_drawn():
    assert best_and_worst([0.1, 0.5, 0.5, -0.2, -0.2]) == (1, 3)
    assert best_and_worst([3.0, -1.0, 2.0]) == (0, 1)
    assert best_and_worst([0.0, 0.0]) == (0, 0)


def _samples(scores: list[list[float]]) -> list[dict]:
    """m samples per prompt, consecutive, each named by its prompt and position ("p1s2")."""
    return [{"response": f"p{p}s{i}", "judge": s} for p, row in enumerate(scores) for i, s in enumerate(row)]


def test_pairs_are_argmax_and_argmin_of_the_first_n_with_n_recorded():
    conversation = [{"role": "user", "content": "Tell me a story."}]
    prompts = ["Once upon a time", conversation, "A tie"]
    scores = [
        [0.2, -0.7, 0.9, 0.1, 5.0],  # the 5th sample is past N = 4: not a candidate
        [-0.3, 0.4, 0.4, -0.3, -9.0],  # ties: the first drawn wins, for the best and the worst
        [0.5, 0.5, 0.5, 0.5, 1.0],  # best and worst of the first 4 tie: left out
    ]
    records, tied, empty = best_worst_pairs(
        prompts, _samples(scores), m=5, n=4, score_key="judge", scored_by="judge j:f"
    )
    assert (tied, empty) == (1, 0)
    assert [(r["chosen"], r["rejected"]) for r in records] == [("p0s2", "p0s1"), ("p1s1", "p1s0")]
    assert [(r["chosen_score"], r["rejected_score"]) for r in records] == [(0.9, -0.7), (0.4, -0.3)]
    assert [r["prompt"] for r in records] == ["Once upon a time", conversation]  # as given: the conversation kept
    assert all(r["n"] == 4 and r["scored_by"] == "judge j:f" for r in records)
    assert [r["prompt_index"] for r in records] == [0, 1]
    assert all(r["written_by"] == "rlhf-lit best-of-n" for r in records)


@pytest.mark.parametrize(("m", "n", "message"), [(4, 1, r"2 <= N <= 4"), (4, 5, r"2 <= N <= 4"), (3, 2, r"12 samples")])
def test_bad_sizes_are_refused(m, n, message):
    with pytest.raises(ValueError, match=message):
        best_worst_pairs(["a", "b", "c"], _samples([[0.0] * 4] * 3), m=m, n=n, score_key="judge", scored_by="")


def test_a_prompt_whose_best_or_worst_is_empty_is_left_out_and_counted():
    # The data module refuses an empty response: such a pair would stop the fit at its line.
    samples = [
        *({"response": r, "rm": s} for r, s in [("good", 2.0), ("", -1.0), ("fine", 0.5)]),  # worst empty
        *({"response": r, "rm": s} for r, s in [("  ", 3.0), ("bad", -2.0), ("ok", 0.0)]),  # best blank
        *({"response": r, "rm": s} for r, s in [("best", 1.0), ("", 0.5), ("worst", -1.0)]),  # empty in between
    ]
    records, tied, empty = best_worst_pairs(["a", "b", "c"], samples, m=3, n=3, score_key="rm", scored_by="rm")
    assert (tied, empty) == (0, 2)
    assert [(r["prompt"], r["chosen"], r["rejected"]) for r in records] == [("c", "best", "worst")]

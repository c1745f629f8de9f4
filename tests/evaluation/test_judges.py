"""Judges: VADER on clearly positive / negative text, loading by spec, clear errors."""

from __future__ import annotations

import pickle
import re
import sys

import pytest

from rlhf_lit.evaluation import judges
from rlhf_lit.evaluation.judges import load_judge, vader


def test_vader_signs_and_range():
    positive, negative, neutral = vader(
        [
            "What a wonderful, happy day! I love my kind friends.",
            "This is a horrible, awful day. I hate it and I am sad.",
            "The table is in the kitchen.",
        ]
    )
    assert positive > 0.5
    assert negative < -0.5
    assert neutral == 0.0  # no lexicon word: compound is exactly 0


def test_builtin_spec_is_vader():
    texts = ["I love it", "I hate it", "A chair."]
    assert load_judge("rlhf_lit.evaluation.judges:vader")(texts) == vader(texts)


@pytest.fixture
def judge_module(tmp_path, monkeypatch):
    """A user's judge module on sys.path."""
    (tmp_path / "my_judges.py").write_text(
        "class Scorer:\n"
        "    @staticmethod\n"
        "    def shout(texts):\n"
        "        return [t.count('!') for t in texts]\n"
        "def length(texts):\n"
        "    return [len(t) for t in texts]\n"
        "def too_few(texts):\n"
        "    return [1.0]\n"
        "def not_finite(texts):\n"
        "    return [float('nan') for t in texts]\n"
        "def words(texts):\n"
        "    return [1.0] + ['good'] * (len(texts) - 1)\n"
        "THRESHOLD = 3\n"
    )
    (tmp_path / "broken_judge.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_judges"
    for name in ("my_judges", "broken_judge"):
        sys.modules.pop(name, None)


def test_load_user_function(judge_module):
    scores = load_judge("my_judges:length")(["abc", "hello"])
    assert scores == [3.0, 5.0]
    assert all(type(s) is float for s in scores)  # ints from the judge become floats


def test_load_nested_attribute(judge_module):
    assert load_judge("my_judges:Scorer.shout")(["a!", "b!!!", "c"]) == [1.0, 3.0, 0.0]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("my_judges.length", "is not of the form 'module:function'"),
        (":length", "is not of the form 'module:function'"),
        ("my_judges:", "is not of the form 'module:function'"),
        ("no_such_judge_module_xyz:score", "no module named 'no_such_judge_module_xyz'"),
        ("my_judges:nope", "'my_judges' has no attribute 'nope'"),
        ("my_judges:THRESHOLD", "'THRESHOLD' is not callable (type int)"),
    ],
)
def test_bad_spec_names_the_spec(judge_module, spec, message):
    with pytest.raises(ValueError, match=re.escape(repr(spec))) as err:
        load_judge(spec)
    assert message in str(err.value)


def test_missing_dependency_inside_judge_module_is_not_blamed_on_spec(judge_module):
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_xyz"):
        load_judge("broken_judge:score")


def test_judge_output_is_checked(judge_module):
    with pytest.raises(ValueError, match=r"'my_judges:too_few' returned 1 scores for 2 texts"):
        load_judge("my_judges:too_few")(["a", "b"])
    with pytest.raises(ValueError, match=r"'my_judges:words' returned 'good' \(str\) for text 1; a judge returns one"):
        load_judge("my_judges:words")(["a", "b"])


def test_a_judge_that_cannot_score_is_refused_where_it_is_loaded(judge_module):
    # Asked once with a plain sentence when loaded: refused before any sampling, in one line naming it.
    with pytest.raises(ValueError, match=r"'my_judges:not_finite' returned a non-finite score \(nan\) for text 0"):
        load_judge("my_judges:not_finite")
    with pytest.raises(
        ValueError, match=r"^judge 'os:getcwd' failed on 1 text\(s\): TypeError: .*one number per text\)$"
    ):
        load_judge("os:getcwd")
    with pytest.raises(ValueError, match=r"^judge 'json:dumps' returned \d+ scores for 1 texts$"):
        load_judge("json:dumps")


def test_vader_missing_says_how_to_install(monkeypatch):
    judges._vader_analyzer.cache_clear()
    monkeypatch.setitem(sys.modules, "vaderSentiment", None)  # None makes the import fail
    monkeypatch.setitem(sys.modules, "vaderSentiment.vaderSentiment", None)
    try:
        with pytest.raises(ImportError, match=re.escape("pip install 'rlhf-lit[demo]'")):
            vader(["hello"])
    finally:
        judges._vader_analyzer.cache_clear()


def test_loaded_judge_pickles_by_spec(judge_module):
    # ddp_spawn pickles the module and callbacks that hold a judge.
    judge = pickle.loads(pickle.dumps(load_judge("my_judges:length")))
    assert judge.spec == "my_judges:length" and judge(["abcd"]) == [4.0]

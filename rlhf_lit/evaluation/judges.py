"""Pluggable judges: a function from texts to one float score each (higher is better).

A judge is named by a spec ``"module:function"`` (``"pkg.mod:Class.method"`` also works), so a
user swaps the gold judge (of the demo, of ``PPOModule(judge=...)``, of the online-generation
callback) without touching rlhf-lit. This is the project's one judge loader. The built-in judge is
``rlhf_lit.evaluation.judges:vader``: the VADER sentiment ``compound`` score, in ``[-1, 1]``.

Judges see the response text only (the completion, without the prompt: the prompt is the same
for every sample of a prompt, and the policy cannot change it), unless told to read prompt +
response (:data:`JudgeReads`, ``--judge-reads`` of the commands, ``judge_reads`` of the
callbacks): a judge that needs the prompt, such as a held-out reward model wrapped as a function,
then reads the prompt as the policy read it (rendered with its chat template when it was,
:mod:`rlhf_lit.data.prompt_rendering`) followed by the response, the text the reward model scored:
the template's special tokens are in it as text, so a judge that tokenizes it passes
``add_special_tokens=False``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Literal, get_args

from rlhf_lit.callable_specs import resolve_callable
from rlhf_lit.option_values import check_choice

JudgeReads = Literal["response", "query_response"]
"""What a judge reads: the response alone, or the prompt as the policy read it + the response."""

Judge = Callable[[list[str]], list[float]]
"""A judge: ``texts -> scores``, one float per text, higher is better."""

DEFAULT_JUDGE = "rlhf_lit.evaluation.judges:vader"
"""The built-in gold judge (the demo's)."""


@functools.lru_cache(maxsize=1)
def _vader_analyzer():
    """The VADER analyzer, built once (it reads its lexicon from the wheel)."""
    try:
        from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer
    except ImportError as e:
        raise ImportError("the 'vader' judge needs the vaderSentiment package: pip install 'rlhf-lit[demo]'") from e
    return SentimentIntensityAnalyzer()


def vader(texts: Sequence[str]) -> list[float]:
    """VADER sentiment ``compound`` score of each text, in ``[-1, 1]`` (positive is happier)."""
    analyzer = _vader_analyzer()
    return [float(analyzer.polarity_scores(t)["compound"]) for t in texts]


class CheckedJudge:
    """A loaded judge that checks its output; picklable (it holds the spec, not a closure).

    Pickling re-imports the judge by its spec, so a module or callback holding one can go to
    spawned processes (``ddp_spawn``) even when the judge function itself cannot be pickled.
    """

    def __init__(self, spec: str) -> None:
        self.spec, self.fn = spec, resolve_callable(spec, "judge spec", DEFAULT_JUDGE)

    def __call__(self, texts: Sequence[str]) -> list[float]:
        """One finite float per text; anything else raises an error naming the spec."""
        texts = list(texts)
        scores = list(self.fn(texts))
        if len(scores) != len(texts):
            raise ValueError(f"judge {self.spec!r} returned {len(scores)} scores for {len(texts)} texts")
        out = []
        for i, score in enumerate(scores):
            try:
                out.append(float(score))
            except (TypeError, ValueError):
                raise ValueError(
                    f"judge {self.spec!r} returned {score!r} ({type(score).__name__}) for text {i}; "
                    "a judge returns one number per text"
                ) from None
            if not math.isfinite(out[-1]):
                raise ValueError(f"judge {self.spec!r} returned a non-finite score ({score!r}) for text {i}")
        return out

    def __reduce__(self):
        return CheckedJudge, (self.spec,)

    def __repr__(self) -> str:
        return f"CheckedJudge({self.spec!r})"


def judge_texts(prompts: Sequence[str], responses: Sequence[str], reads: JudgeReads) -> list[str]:
    """The texts a judge reads (:data:`JudgeReads`): ``responses``, or each rendered prompt + its response."""
    check_choice("judge_reads", reads, get_args(JudgeReads))
    return list(responses) if reads == "response" else [p + r for p, r in zip(prompts, responses, strict=True)]


def load_judge(spec: str) -> CheckedJudge:
    """Load the judge named by ``spec`` (``"module:function"``).

    The returned callable checks what the judge gives back: exactly one finite number per text,
    returned as a ``list[float]``; anything else raises an error naming the spec.

    Args:
        spec: ``"module:function"``, e.g. ``"rlhf_lit.evaluation.judges:vader"``.

    Raises:
        ValueError: a malformed spec, a missing module or attribute, or a non-callable target.
    """
    return CheckedJudge(spec)

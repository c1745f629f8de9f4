"""Pluggable judges: a function from texts to one float score each (higher is better), or a reward model.

A judge is named by a spec ``"module:function"`` (``"pkg.mod:Class.method"`` also works), so a
user swaps the gold judge (of the demo, of ``PPOModule(judge=...)``, of the online-generation
callback) without touching rlhf-lit. This is the project's one judge loader. The built-in judge is
``rlhf_lit.evaluation.judges:vader``: the VADER sentiment ``compound`` score, in ``[-1, 1]``.

A spec that is a directory is a reward-model export (a gold reward model beside the proxy PPO optimises):
:class:`~rlhf_lit.evaluation.reward_judge.RewardModelJudge` scores each (prompt, response) pair with it.
Every judge is asked through :func:`judge_scores`, which gives a function judge the texts it reads and a
judge that reads prompts (``reads_prompts``, the reward model) the prompts and the responses.

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
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, get_args

from rlhf_lit.callable_specs import resolve_callable
from rlhf_lit.option_values import check_choice

if TYPE_CHECKING:  # annotations only: importing this module loads no model code
    from rlhf_lit.models.loading import ModelLoading

JudgeReads = Literal["response", "query_response"]
"""What a judge reads: the response alone, or the prompt as the policy read it + the response."""

Judge = Callable[..., list[float]]
"""A judge: ``texts -> scores``, one float per text, higher is better; or one that reads prompts
(``reads_prompts`` True: ``(prompts, responses, device) -> scores``). Asked through :func:`judge_scores`."""

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


PROBE_TEXTS = ("Once upon a time there was a happy dog.",)
"""What a function judge is asked once when it is loaded (:class:`CheckedJudge`): a judge that cannot score a
plain sentence is refused there, not after the first rollout's sampling."""


class CheckedJudge:
    """A loaded judge that checks its output; picklable (it holds the spec, not a closure).

    Pickling re-imports the judge by its spec, so a module or callback holding one can go to
    spawned processes (``ddp_spawn``) even when the judge function itself cannot be pickled.
    """

    def __init__(self, spec: str) -> None:
        self.spec, self.fn = spec, resolve_callable(spec, "judge spec", DEFAULT_JUDGE)
        self(PROBE_TEXTS)  # a judge that cannot score is refused where it is loaded, before any sampling

    def __call__(self, texts: Sequence[str]) -> list[float]:
        """One finite float per text; anything else (a judge that raises, too) raises an error naming the spec."""
        texts = list(texts)
        try:
            scores = list(self.fn(texts))
        except Exception as error:  # the user's function: whatever it raises is one line naming it
            raise ValueError(
                f"judge {self.spec!r} failed on {len(texts)} text(s): {type(error).__name__}: {error} "
                "(a judge takes a list of texts and returns one number per text)"
            ) from error
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


def reads_prompts(judge: Judge) -> bool:
    """Whether ``judge`` scores (prompt, response) pairs (a reward model) rather than texts."""
    return bool(getattr(judge, "reads_prompts", False))


def judge_scores(
    judge: Judge, prompts: Sequence[str], responses: Sequence[str], reads: JudgeReads, device: Any = None
) -> list[float]:
    """The one way a judge is asked: a function judge scores the texts it reads (:func:`judge_texts`: the
    responses, or with ``reads`` ``query_response`` each prompt + its response); a judge that reads prompts
    (:func:`reads_prompts`) scores each (prompt, response) pair on ``device`` (the caller's), whatever ``reads``.

    ``prompts``: each prompt as the policy read it (its rendered text); read only when the judge reads them
    (``[]`` will do otherwise: :func:`needs_prompts`)."""
    if reads_prompts(judge):
        return judge(list(prompts), list(responses), device=device)
    return judge(judge_texts(prompts, responses, reads))


def needs_prompts(judge: Judge, reads: JudgeReads) -> bool:
    """Whether :func:`judge_scores` reads the prompts of ``judge`` with ``reads`` (else they need not be decoded)."""
    return reads == "query_response" or reads_prompts(judge)


def is_directory_spec(spec: str) -> bool:
    """Whether a judge spec names a directory (a reward-model export) rather than ``module:function``: an
    existing directory, or a path (a ``/`` and no ``:``)."""
    return os.path.isdir(os.path.expanduser(spec)) or ("/" in spec and ":" not in spec)


def load_judge(spec: str, loading: ModelLoading | None = None, device: str = "cpu", option: str = "judge") -> Judge:
    """Load the judge named by ``spec``: ``"module:function"``, or the directory of a reward-model export.

    A function judge comes back as a :class:`CheckedJudge`: it checks what the judge gives back (exactly one
    finite number per text, returned as a ``list[float]``); anything else raises an error naming the spec. A
    directory comes back as a :class:`~rlhf_lit.evaluation.reward_judge.RewardModelJudge`, loaded as
    ``loading`` says (the caller's dtype and attention kernel) onto ``device``.

    Args:
        spec: ``"module:function"``, e.g. ``"rlhf_lit.evaluation.judges:vader"``, or a reward-model export.
        loading: how a reward model is loaded (:class:`~rlhf_lit.models.loading.ModelLoading`); None: the defaults.
        device: where a reward model scores until a call gives the caller's device.
        option: the option that named it, for messages (``judge``, ``--judge``).

    Raises:
        ValueError: a malformed spec, a missing module or attribute, or a non-callable target; a directory
            that is not a reward-model export (naming the path).
    """
    if is_directory_spec(spec):
        from rlhf_lit.evaluation.reward_judge import RewardModelJudge

        return RewardModelJudge(spec, loading, device, option)
    return CheckedJudge(spec)

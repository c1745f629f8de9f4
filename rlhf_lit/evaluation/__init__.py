"""Scoring generated text: pluggable judges (``"module:function"``) and diversity metrics.

Used by the PPO stage (``objective/judge``, ``diversity/*`` per rollout), the online-generation
callback and the demo's evaluation, so that every place scores a response the same way
(:func:`response_texts` decodes what a judge reads). Imports nothing else from rlhf_lit; a judge's
own dependencies load on first use.
"""

from rlhf_lit.evaluation.diversity import distinct_n, ngrams
from rlhf_lit.evaluation.judges import DEFAULT_JUDGE, Judge, load_judge, vader
from rlhf_lit.evaluation.texts import response_texts

__all__ = ["DEFAULT_JUDGE", "Judge", "distinct_n", "load_judge", "ngrams", "response_texts", "vader"]

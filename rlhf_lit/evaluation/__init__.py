"""Scoring generated text and evaluating policies: judges, diversity, and the evaluations behind the commands.

The package itself holds what the PPO stage (``objective/judge``, ``diversity/*`` per rollout),
the online-generation callback and :mod:`rlhf_lit.evaluation.policy_metrics` share, so that every place scores a
response the same way (:func:`response_texts` decodes what a judge reads): importing it imports
nothing of rlhf_lit's but :mod:`rlhf_lit.callable_specs` and :mod:`rlhf_lit.option_values`, and a
judge's own dependencies load on first use.

Its modules beside that are the library under ``rlhf-lit evaluate`` and ``rlhf-lit best-of-n``
(the commands in :mod:`rlhf_lit.commands` only parse options and write the result):

- :mod:`rlhf_lit.evaluation.policy_metrics`: :func:`~rlhf_lit.evaluation.policy_metrics.evaluate_policy`,
  a policy's judge score, RM score, KL to a reference, distinct-n and length on prompts;
- :mod:`rlhf_lit.evaluation.best_of_n_sweep`: :func:`~rlhf_lit.evaluation.best_of_n_sweep.best_of_n`,
  best-of-N by a reward model swept over N;
- :mod:`rlhf_lit.evaluation.samples`: loading the models and sampling measured responses.

Their prompts come from a prompt source read as the data modules read theirs (:mod:`rlhf_lit.data.prompt_source`).
"""

from rlhf_lit.evaluation.diversity import distinct_n, distinct_n_factors, ngrams
from rlhf_lit.evaluation.judges import DEFAULT_JUDGE, Judge, load_judge, vader
from rlhf_lit.evaluation.texts import prompt_texts, response_texts

__all__ = [
    "DEFAULT_JUDGE",
    "Judge",
    "distinct_n",
    "distinct_n_factors",
    "load_judge",
    "ngrams",
    "prompt_texts",
    "response_texts",
    "vader",
]

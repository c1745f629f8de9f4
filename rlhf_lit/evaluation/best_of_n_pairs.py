"""The best and the worst of N samples per prompt as preference pairs (``rlhf-lit best-of-n --pairs-out``).

What BoNBoN trains on (:class:`rlhf_lit.stages.BoNBoNModule`): per prompt, of the first N samples the
policy drew for it, the one with the highest score as ``chosen`` and the one with the lowest as
``rejected``, with N recorded in every record (``n``) so that the stage can check it against its own.
Equal scores go to the sample drawn first, for the best and for the worst alike. A prompt whose best and
worst tie (equal scores, or the same text) is left out and counted: such a pair says nothing, and
BoNBoN's coefficient assumes scores that do not tie. So is a prompt whose best or worst reply is empty
(the policy ended at once, or wrote only spaces), counted apart: the preference data module refuses a
record with an empty response.

A record: ``{"written_by", "prompt", "chosen", "rejected", "chosen_score", "rejected_score", "n",
"scored_by", "prompt_index"}``; ``prompt`` is the prompt as given (a string, or the conversation), the
responses are the decoded replies, so the preference data module reads the file as it is (format
``fields``, or ``auto``), and its ``n`` with ``extra_fields: [n]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlhf_lit.artifacts import WRITTEN_BY_KEY

N_KEY = "n"
"""The key of N in a pair record (what :class:`~rlhf_lit.stages.BoNBoNModule` reads through ``extra_fields``)."""


def best_and_worst(scores: Sequence[float]) -> tuple[int, int]:
    """Indices of the best (highest) and the worst (lowest) of one prompt's ``scores``; ties to the first drawn."""
    best = min(range(len(scores)), key=lambda i: (-scores[i], i))
    worst = min(range(len(scores)), key=lambda i: (scores[i], i))
    return best, worst


def best_worst_pairs(
    prompts: Sequence[Any],
    samples: Sequence[dict],
    m: int,
    n: int,
    score_key: str,
    scored_by: str,
    written_by: str = "rlhf-lit best-of-n",
) -> tuple[list[dict], int, int]:
    """One pair record per prompt from the best-of-N result's ``samples`` (:func:`~rlhf_lit.evaluation.
    best_of_n_sweep.best_of_n`: ``m`` consecutive samples per prompt, each with ``response`` and its score under
    ``score_key``), picked among each prompt's first ``n``; returns ``(records, tied, empty)``, the prompts left
    out because their best and worst tie, and because one of them is empty (module docstring). ``prompts``: as
    given, one per prompt; ``scored_by`` and ``written_by`` (the command) are recorded."""
    if not 2 <= n <= m:
        raise ValueError(f"pairs need 2 <= N <= {m} (the samples per prompt); got N = {n}")
    if len(samples) != m * len(prompts):
        raise ValueError(f"{len(samples)} samples for {len(prompts)} prompts of {m} samples each")
    records, tied, empty = [], 0, 0
    for p, prompt in enumerate(prompts):
        drawn = samples[p * m : p * m + n]
        best, worst = best_and_worst([s[score_key] for s in drawn])
        chosen, rejected = drawn[best], drawn[worst]
        if chosen[score_key] == rejected[score_key] or chosen["response"] == rejected["response"]:
            tied += 1
            continue
        if not chosen["response"].strip() or not rejected["response"].strip():
            empty += 1
            continue
        records.append(
            {
                WRITTEN_BY_KEY: written_by,
                "prompt": prompt,
                "chosen": chosen["response"],
                "rejected": rejected["response"],
                "chosen_score": chosen[score_key],
                "rejected_score": rejected[score_key],
                N_KEY: n,
                "scored_by": scored_by,
                "prompt_index": p,
            }
        )
    return records, tied, empty

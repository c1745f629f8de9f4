"""The labels of ``rlhf-lit iterate``: scoring the policy's samples, ranking them, reading a person's labels
file, splitting off the held-out part, and a reward model's pairwise accuracy on ranked records.

Every label is a ranking record, the shape of the ``rankings`` format, written by its one writer
(:func:`rlhf_lit.data.rankings.ranking_record`): ``{"prompt", "responses": [best, ..., worst], "ranks": [0, ...]}``
(equal ranks tie), plus ``scores`` (the labeller's, when it scores) and ``iteration``. A pairs record
``{"prompt", "chosen", "rejected"}`` in a labels file is the ranking ``[chosen, rejected]``, ``ranks [0, 1]`` (for
K = 2 the reward model's ranking loss is its pairwise loss bit for bit, docs/CONTRACTS.md). The reward model reads
them with ``format: rankings`` and ``fields: {ranks: ranks}``.

A record keeps the prompt and responses as the policy read them (:func:`as_policy_read`): a policy that reads its
prompts in its chat template gets a messages list and assistant turns, which the reward model's data module and
:class:`~rlhf_lit.evaluation.reward_judge.RewardModelScorer` render with the same template and generation prompt; a
judge reads the rendered prompt (``query_response``; a reward-model judge always) and the response's text.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Protocol


def as_policy_read(record: dict, chat: bool) -> dict:
    """``record`` with its ``prompt`` and ``responses`` as the policy read them: with ``chat`` (string prompts
    rendered with the chat template) or a conversation prompt, the prompt as messages (a string: one user turn)
    and each response as an assistant turn, which the data module renders with the same template and generation
    prompt; else as they are."""
    from rlhf_lit.data.conversation import as_prompt, as_response, from_json, is_conversation

    prompt = from_json(record["prompt"])
    if not (chat or is_conversation(prompt)):
        return record
    return {
        **record,
        "prompt": as_prompt(prompt),
        "responses": [as_response(from_json(r)) for r in record["responses"]],
    }


class Scorer(Protocol):
    """A labeller that scores: ``(prompts, responses)`` as the labels keep them (:func:`as_policy_read`) -> one
    float each, higher is better."""

    def __call__(self, prompts: Sequence[Any], responses: Sequence[Any]) -> list[float]: ...


class JudgeScorer:
    """A judge (:func:`rlhf_lit.evaluation.load_judge`: ``module:function``, or a reward-model export scoring on
    ``device``) reading the response's text, or the prompt rendered as the policy read it (``tokenizer``'s chat
    template for a conversation) + the response (:func:`rlhf_lit.evaluation.judges.judge_scores`)."""

    def __init__(self, spec: str, reads: str = "response", tokenizer: Any = None, device: str = "cpu") -> None:
        from rlhf_lit.evaluation.judges import judge_texts, load_judge

        judge_texts([], [], reads)  # an unknown judge_reads fails here
        self.judge, self.reads, self.tokenizer = load_judge(spec, device=device), reads, tokenizer

    def __call__(self, prompts: Sequence[Any], responses: Sequence[Any]) -> list[float]:
        """The judge's scores of what it reads (:func:`rlhf_lit.evaluation.judges.judge_scores`)."""
        from rlhf_lit.data.conversation import from_json, is_conversation
        from rlhf_lit.data.encoding import TextEncoder
        from rlhf_lit.evaluation.judges import judge_scores, needs_prompts

        texts = [r if isinstance(r, str) else "".join(m["content"] for m in r) for r in responses]
        read = [from_json(p) for p in prompts] if needs_prompts(self.judge, self.reads) else []
        if any(map(is_conversation, read)):
            read = [TextEncoder(self.tokenizer).render_prompt(p) for p in read]
        return judge_scores(self.judge, read, texts, self.reads)


def rank_by_scores(prompt: Any, responses: Sequence[str], scores: Sequence[float]) -> dict | None:
    """One ranking record of a prompt's responses by score (best first, equal scores tie), or None when fewer
    than 2 distinct non-empty responses are left or all of them tie (no pair to learn from)."""
    from rlhf_lit.data.rankings import distinct_responses, order_by_scores, ranking_record

    kept = distinct_responses(responses)
    kept_scores = [scores[i] for i in kept]
    if len(kept) < 2 or len(set(kept_scores)) == 1:
        return None
    order, ranks = order_by_scores(kept_scores)
    return ranking_record(prompt, [responses[i] for i in kept], order, ranks, kept_scores)


def best_and_worst_of_k(
    samples: Sequence[dict], scores: Sequence[Sequence[float]], k: int, scored_by: str, written_by: str, chat: bool
) -> tuple[list[dict], int, int]:
    """BoNBoN's pairs of the loop's samples (``{"prompt", "responses"}``, ``k`` each) by their ``scores``: per prompt
    the best and the worst of its K, as ``rlhf-lit best-of-n --pairs-out`` writes them
    (:func:`~rlhf_lit.evaluation.best_of_n_pairs.best_worst_pairs`: ties and empty replies left out, N = K
    recorded), the prompt and replies as the policy read them (:func:`as_policy_read`); ``(records, tied, empty)``."""
    from rlhf_lit.evaluation.best_of_n_pairs import best_worst_pairs

    flat = [{"response": r, "score": x} for s, xs in zip(samples, scores) for r, x in zip(s["responses"], xs)]
    prompts = [s["prompt"] for s in samples]
    records, tied, empty = best_worst_pairs(prompts, flat, k, k, "score", scored_by, written_by)
    for record in records:
        read = as_policy_read({"prompt": record["prompt"], "responses": [record["chosen"], record["rejected"]]}, chat)
        record.update(prompt=read["prompt"], chosen=read["responses"][0], rejected=read["responses"][1])
    return records, tied, empty


def read_labels_file(path: str) -> list[dict]:
    """A person's labels (JSONL: rankings records, ``ranks`` optional, or pairs records) as ranking records.

    Raises ``ValueError`` naming the file, line and field of the first bad record (before any training).
    """
    import os

    from rlhf_lit.data.example import Fields, Skip
    from rlhf_lit.data.rankings import RANKS_FIELD, ranking_record, read_ranking
    from rlhf_lit.data.record_parts import get_prompt, get_response
    from rlhf_lit.data.records import InvalidRecord, read_rows

    if not os.path.isfile(path):
        raise ValueError(f"labels file {path}: no such file")
    try:
        rows = read_rows(path)
    except InvalidRecord as error:
        raise ValueError(f"labels file {error}") from None
    if not rows:
        raise ValueError(f"labels file {path}: no records")
    records = []
    for row in rows:
        try:
            prompt = get_prompt(row, "prompt")
            if "responses" in row.data:
                fields = Fields(ranks=RANKS_FIELD if RANKS_FIELD in row.data else None)
                try:
                    responses, ranks = read_ranking(row, fields)
                except Skip:
                    continue  # all tie: nothing to learn, as the data module skips it
            elif "chosen" in row.data or "rejected" in row.data:
                responses = [get_response(row, "chosen", prompt), get_response(row, "rejected", prompt)]
                if responses[0] == responses[1]:
                    raise InvalidRecord(f"{row.where}: field 'rejected' repeats 'chosen' (responses must differ)")
                ranks = [0, 1]
            else:
                keys = ", ".join(map(str, row.data)) or "none"
                raise InvalidRecord(
                    f"{row.where}: neither a rankings record (field 'responses') nor a pairs "
                    f"record (fields 'chosen', 'rejected'); record keys: {keys}"
                )
        except InvalidRecord as error:
            raise ValueError(f"labels file {error}") from None
        records.append(ranking_record(prompt, responses, range(len(responses)), ranks, None))
    if not records:
        raise ValueError(f"labels file {path}: every record ties all its responses (no pair to learn from)")
    return records


def split_held_out(records: Sequence[dict], fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """``(train, held_out)``: ``round(fraction * n)`` records drawn by ``seed`` held out (at least one record
    stays in train), both in the records' order."""
    n = len(records)
    held = min(round(fraction * n), n - 1) if n else 0
    picked = set(random.Random(seed).sample(range(n), held)) if held > 0 else set()
    return [r for i, r in enumerate(records) if i not in picked], [r for i, r in enumerate(records) if i in picked]


def score_responses(scorer: Scorer, records: Sequence[dict]) -> list[list[float]]:
    """Each ``{"prompt", "responses"}`` record's responses' scores, from one call of ``scorer`` (none without
    a response)."""
    prompts = [r["prompt"] for r in records for _ in r["responses"]]
    scores = iter(scorer(prompts, [x for r in records for x in r["responses"]]) if prompts else [])
    return [[next(scores) for _ in r["responses"]] for r in records]


def pairwise_accuracy(scorer: Scorer, records: Sequence[dict]) -> tuple[float | None, int]:
    """``(accuracy, pairs)``: over every (better, worse) pair of the ranking records, the fraction the
    scorer orders as labelled (an equal score counts one half); ``(None, 0)`` with no pair."""
    from rlhf_lit.data.rankings import RANKS_FIELD, ranked_pairs

    outcomes = [
        1.0 if scores[i] > scores[j] else 0.5 if scores[i] == scores[j] else 0.0
        for record, scores in zip(records, score_responses(scorer, records))
        for i, j in ranked_pairs(record[RANKS_FIELD])
    ]
    return (sum(outcomes) / len(outcomes) if outcomes else None), len(outcomes)


def count_pairs(records: Sequence[dict]) -> int:
    """The labelled (untied) pairs the ranking records hold."""
    from rlhf_lit.data.rankings import RANKS_FIELD, count_ranked_pairs

    return sum(count_ranked_pairs(r[RANKS_FIELD]) for r in records)

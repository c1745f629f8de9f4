"""The labels of ``rlhf-lit iterate``: scoring the policy's samples, ranking them, reading a person's labels
file, splitting off the held-out part, and a reward model's pairwise accuracy on ranked records.

Every label is a ranking record, the shape of the ``rankings`` format (:mod:`rlhf_lit.data.rankings`):
``{"prompt", "responses": [best, ..., worst], "ranks": [0, ...]}`` (equal ranks tie), plus ``scores`` (the
labeller's, when it scores) and ``iteration``. A pairs record ``{"prompt", "chosen", "rejected"}`` in a labels
file is the ranking ``[chosen, rejected]``, ``ranks [0, 1]`` (for K = 2 the reward model's ranking loss is
its pairwise loss bit for bit, docs/CONTRACTS.md). The reward model reads them with ``format: rankings`` and
``fields: {ranks: ranks}``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any, Protocol

RANKS_FIELD = "ranks"


class Scorer(Protocol):
    """A labeller that scores: ``(prompts as the policy read them, responses) -> one float each``, higher is better."""

    def __call__(self, prompts: Sequence[str], responses: Sequence[str]) -> list[float]: ...


class JudgeScorer:
    """A ``module:function`` judge (:func:`rlhf_lit.evaluation.load_judge`) reading the response or prompt + response."""

    def __init__(self, spec: str, reads: str = "response") -> None:
        from rlhf_lit.evaluation.judges import judge_texts, load_judge

        judge_texts([], [], reads)  # an unknown judge_reads fails here
        self.judge, self.reads = load_judge(spec), reads

    def __call__(self, prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
        """The judge's scores of the texts it reads (:func:`rlhf_lit.evaluation.judges.judge_texts`)."""
        from rlhf_lit.evaluation.judges import judge_texts

        return self.judge(judge_texts(prompts, responses, self.reads))


class RewardModelScorer:
    """A reward model (or ensemble) directory scoring prompt + response texts, encoded as its data module does."""

    def __init__(self, path: str, device: str = "cpu", batch_size: int = 32) -> None:
        from rlhf_lit.models.reward_ensemble import load_any_reward_model
        from rlhf_lit.tokenizer import load_tokenizer

        self.tokenizer = load_tokenizer(path, padding_side="right")
        self.model = load_any_reward_model(path, self.tokenizer).to(device).eval()
        self.device, self.batch_size = device, batch_size

    def __call__(self, prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
        """Normalised scores (:func:`rlhf_lit.models.reward_ensemble.reward_scores`), one per (prompt, response)."""
        import torch

        from rlhf_lit.data.encoding import TextEncoder
        from rlhf_lit.functional import pad_ids
        from rlhf_lit.models.reward_ensemble import reward_scores

        prompt_ids, response_ids, ends = TextEncoder(self.tokenizer).encode_pairs(list(prompts), list(responses))
        rows = [p + r + [e] for p, r, e in zip(prompt_ids, response_ids, ends)]
        scores: list[float] = []
        for start in range(0, len(rows), self.batch_size):
            ids, mask = pad_ids(rows[start : start + self.batch_size], int(self.tokenizer.pad_token_id), "right")
            with torch.no_grad():
                scores += reward_scores(self.model, ids.to(self.device), mask.to(self.device)).tolist()
        return scores


def rank_by_scores(prompt: Any, responses: Sequence[str], scores: Sequence[float]) -> dict | None:
    """One ranking record of a prompt's responses by score (best first, equal scores tie), or None when fewer
    than 2 distinct non-empty responses are left or all of them tie (no pair to learn from)."""
    kept, seen = [], set()
    for i, response in enumerate(responses):
        if response.strip() and response not in seen:  # a repeat adds no comparison; the data refuses it
            kept.append(i)
            seen.add(response)
    if len(kept) < 2 or len({scores[i] for i in kept}) == 1:
        return None
    order = sorted(kept, key=lambda i: -scores[i])  # stable: equal scores keep sample order
    ranks: list[int] = []
    for n, i in enumerate(order):
        ranks.append(0 if n == 0 else ranks[-1] + (scores[i] < scores[order[n - 1]]))
    return {
        "prompt": prompt,
        "responses": [responses[i] for i in order],
        RANKS_FIELD: ranks,
        "scores": [float(scores[i]) for i in order],
    }


def read_labels_file(path: str) -> list[dict]:
    """A person's labels (JSONL: rankings records, ``ranks`` optional, or pairs records) as ranking records.

    Raises ``ValueError`` naming the file, line and field of the first bad record (before any training).
    """
    import os

    from rlhf_lit.data.example import Fields, Skip
    from rlhf_lit.data.rankings import read_ranking
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
        records.append({"prompt": prompt, "responses": list(responses), RANKS_FIELD: list(ranks)})
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


def pairwise_accuracy(scorer: Scorer, records: Sequence[dict]) -> tuple[float | None, int]:
    """``(accuracy, pairs)``: over every (better, worse) pair of the ranking records, the fraction the
    scorer orders as labelled (an equal score counts one half); ``(None, 0)`` with no pair."""
    prompts, responses, where = [], [], []
    for n, record in enumerate(records):
        prompt = record["prompt"]
        for i, response in enumerate(record["responses"]):
            prompts.append(prompt)
            responses.append(response)
            where.append((n, i))
    if not prompts:
        return None, 0
    scores = dict(zip(where, scorer(prompts, responses)))
    right, pairs = 0.0, 0
    for n, record in enumerate(records):
        ranks = record[RANKS_FIELD]
        for i in range(len(ranks)):
            for j in range(len(ranks)):
                if ranks[i] < ranks[j]:
                    pairs += 1
                    a, b = scores[(n, i)], scores[(n, j)]
                    right += 1.0 if a > b else 0.5 if a == b else 0.0
    return (right / pairs if pairs else None), pairs


def count_pairs(records: Sequence[dict]) -> int:
    """The labelled (untied) pairs the ranking records hold."""
    return sum(a < b for r in records for a in r[RANKS_FIELD] for b in r[RANKS_FIELD])


def jsonl_text(records: Sequence[dict]) -> str:
    """Records as JSONL text (one object a line, non-ASCII kept)."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)

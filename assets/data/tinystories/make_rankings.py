"""Regenerate ``rankings.jsonl`` beside this file from ``val.txt`` (deterministic: no randomness).

    python assets/data/tinystories/make_rankings.py   # needs vaderSentiment (pip install 'rlhf-lit[demo]')

Each record ranks the story continuations of K = 3 or 4 TinyStories paragraphs (alternately) after
the opening of the first one, by the VADER sentiment of the continuation (the demo's gold judge,
``rlhf_lit.evaluation.judges:vader``): happier first. Equal scores tie (same ``ranks`` value), so the
sample exercises ties. Records::

    {"prompt": first PROMPT_WORDS words of the group's first paragraph,
     "responses": [" " + the RESPONSE_WORDS words after each paragraph's first PROMPT_WORDS, best first],
     "ranks": dense ranks, 0 = best, equal = tie,
     "scores": the VADER compound score of each response (an extra column rlhf-lit ignores)}

Paragraphs are taken in file order, K at a time, from those with at least PROMPT_WORDS +
RESPONSE_WORDS words; a group whose continuations all score alike or repeat one another is left out.
The output depends on the vaderSentiment lexicon (written with vaderSentiment 3.3.2).
"""

from __future__ import annotations

import json
from pathlib import Path

from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

HERE = Path(__file__).resolve().parent
PROMPT_WORDS = 6
RESPONSE_WORDS = 12
RECORDS = 320


def paragraphs(path: Path) -> list[list[str]]:
    """The words of every blank-line separated paragraph of ``path`` long enough for a record."""
    text = path.read_text(encoding="utf-8")
    words = [p.split() for p in text.split("\n\n")]
    return [w for w in words if len(w) >= PROMPT_WORDS + RESPONSE_WORDS]


def rankings(words: list[list[str]], analyzer: SentimentIntensityAnalyzer) -> list[dict]:
    """The first :data:`RECORDS` ranking records (module docstring) of the paragraphs ``words``."""
    records: list[dict] = []
    start = 0
    while len(records) < RECORDS and start < len(words):
        k = 3 + len(records) % 2  # K = 3, 4, 3, 4, ...
        group, start = words[start : start + k], start + k
        if len(group) < k:
            break
        responses = [" " + " ".join(w[PROMPT_WORDS : PROMPT_WORDS + RESPONSE_WORDS]) for w in group]
        scores = [analyzer.polarity_scores(r)["compound"] for r in responses]
        if len(set(scores)) < 2 or len(set(responses)) < k:
            continue
        order = sorted(range(k), key=lambda i: -scores[i])  # stable: equal scores keep file order
        distinct = sorted(set(scores), reverse=True)
        records.append({
            "prompt": " ".join(group[0][:PROMPT_WORDS]),
            "responses": [responses[i] for i in order],
            "ranks": [distinct.index(scores[i]) for i in order],
            "scores": [scores[i] for i in order],
        })  # fmt: skip
    return records


def write(out: Path) -> int:
    """Write the records built from ``val.txt`` to ``out`` (one JSON object per line, UTF-8); their number."""
    records = rankings(paragraphs(HERE / "val.txt"), SentimentIntensityAnalyzer())
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return len(records)


def main() -> None:
    """Regenerate ``rankings.jsonl`` beside this file."""
    out = HERE / "rankings.jsonl"
    print(f"wrote {write(out)} records to {out}")


if __name__ == "__main__":
    main()

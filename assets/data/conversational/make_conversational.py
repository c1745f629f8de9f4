"""Regenerate the conversational sample beside this file (deterministic: no randomness, no network).

    python assets/data/conversational/make_conversational.py

Hub-shaped records (docs/data.md, "Conversational records") built from the TinyStories files of
``../tinystories``, so the offline chat model (``models/stories260K-chat``, a TinyStories model)
can learn from them:

- ``sft.jsonl``: ``{"messages": [...]}``, two user/assistant exchanges per story: the user asks
  for a story that starts with a paragraph's first words, the assistant tells that paragraph,
  the user asks what happened next, the assistant tells the start of the next paragraph. Every
  other record opens with a system message.
- ``preferences.jsonl``: ``{"prompt": [user], "chosen": [assistant], "rejected": [assistant]}``
  from ``rankings.jsonl``: the happiest continuation against the least happy one (by the VADER
  scores stored there).
- ``preferences_implicit.jsonl``: ``{"chosen": [user, assistant], "rejected": [user, assistant]}``,
  the same pairs as two whole conversations sharing their first turn (the implicit-prompt shape).
- ``rankings.jsonl``: ``{"prompt": [user], "responses": [...], "ranks": [...]}``, a ranking with a
  conversational prompt.
- ``prompts.jsonl``: ``{"prompt": [user]}``, the PPO prompts.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
STORIES = HERE.parent / "tinystories"
SYSTEM = "You tell short, happy stories for children."
OPENING_WORDS = 6
MAX_WORDS = 40  # an assistant turn keeps at most this many words, ending at a sentence when it can
SFT_RECORDS, PROMPT_RECORDS = 300, 400
PAIRS, IMPLICIT = 200, 60  # ranking records turned into explicit pairs, then implicit pairs; the rest stay rankings


def paragraphs() -> list[str]:
    """The paragraphs of the TinyStories sample with at least 2 * OPENING_WORDS words."""
    text = (STORIES / "val.txt").read_text(encoding="utf-8")
    return [p.strip() for p in text.split("\n\n") if len(p.split()) >= 2 * OPENING_WORDS]


def shorten(text: str) -> str:
    """At most MAX_WORDS words, cut after the last sentence end inside them when there is one."""
    words = text.split()
    if len(words) <= MAX_WORDS:
        return " ".join(words)
    head = " ".join(words[:MAX_WORDS])
    ends = [m.end() for m in re.finditer(r"[.!?]\"?(?=\s|$)", head)]
    return head[: ends[-1]] if ends else head


def ask(opening: str) -> dict[str, str]:
    """The user's request for a story that starts with ``opening``."""
    return {"role": "user", "content": f"Tell me a story that starts with: {opening}"}


def sft(paras: list[str]) -> list[dict]:
    """Two-exchange conversations over consecutive paragraphs."""
    records = []
    for i in range(SFT_RECORDS):
        first, after = paras[2 * i], paras[2 * i + 1]
        opening = " ".join(first.split()[:OPENING_WORDS])
        messages = [{"role": "system", "content": SYSTEM}] if i % 2 == 0 else []
        messages += [ask(opening), {"role": "assistant", "content": shorten(first)},
                     {"role": "user", "content": "What happened next?"},
                     {"role": "assistant", "content": shorten(after)}]  # fmt: skip
        records.append({"messages": messages})
    return records


def preferences(rankings: list[dict]) -> tuple[list[dict], list[dict], list[dict]]:
    """(explicit pairs, implicit-prompt pairs, conversational rankings) from the ranking sample."""
    pairs, implicit, ranked = [], [], []
    for i, r in enumerate(rankings):
        user = {"role": "user", "content": f"Continue the story: {r['prompt']}"}
        best, worst = r["responses"][0].strip(), r["responses"][-1].strip()
        if i < PAIRS:
            pairs.append({"prompt": [user], "chosen": [{"role": "assistant", "content": best}],
                          "rejected": [{"role": "assistant", "content": worst}]})  # fmt: skip
        elif i < PAIRS + IMPLICIT:
            implicit.append({"chosen": [user, {"role": "assistant", "content": best}],
                             "rejected": [user, {"role": "assistant", "content": worst}]})  # fmt: skip
        else:
            ranked.append({"prompt": [user], "responses": [x.strip() for x in r["responses"]], "ranks": r["ranks"]})
    return pairs, implicit, ranked


def write(out: Path, name: str, records: list[dict]) -> None:
    """``out/name``: one JSON object per line, UTF-8, ``\\n`` line ends."""
    with open(out / name, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def main(out: Path = HERE) -> None:
    """Write the five files into ``out`` (by default beside this script)."""
    paras = paragraphs()
    rankings = [json.loads(line) for line in (STORIES / "rankings.jsonl").read_text(encoding="utf-8").splitlines()]
    pairs, implicit, ranked = preferences(rankings)
    opening = [" ".join(p.split()[:OPENING_WORDS]) for p in paras[2 * SFT_RECORDS : 2 * SFT_RECORDS + PROMPT_RECORDS]]
    write(out, "sft.jsonl", sft(paras))
    write(out, "preferences.jsonl", pairs)
    write(out, "preferences_implicit.jsonl", implicit)
    write(out, "rankings.jsonl", ranked)
    write(out, "prompts.jsonl", [{"prompt": [ask(o)]} for o in opening])


if __name__ == "__main__":
    main()

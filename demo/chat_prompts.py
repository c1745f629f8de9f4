"""The chat demo's prompts: the first human turn of the shipped HH-RLHF harmless-base transcripts, each
a one-turn conversation, split by a fixed seed into held-out evaluation prompts, labelling prompts
(the reward model's and DPO's) and PPO's prompts.

The turns are read with the data package's HH reader (:func:`rlhf_lit.data.hh.hh_turns`): the text
after the first ``\\n\\nHuman:`` marker, without the one space that follows it. A request asked in
several transcripts is one prompt (the first time it is met), and requests longer than
:data:`MAX_WORDS` words are left out (the demo samples short replies to short requests). The split
is a seeded shuffle of what is left, so the held-out prompts are the same for every run seed, and
no prompt is in two parts. Each part is written as JSONL, ``{"prompt": [{"role": "user", "content":
...}]}``, which every data module and command reads as a conversation (rendered with the model's
chat template and its generation prompt).
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

from rlhf_lit.artifacts import write_text_atomically
from rlhf_lit.data.example import Skip
from rlhf_lit.data.hh import hh_turns

MAX_WORDS = 40
"""Requests of more words than this are not used as prompts."""
SPLIT_SEED = 0
"""The seed of the split: fixed, so every run seed is evaluated on the same held-out prompts."""
PARTS = ("eval", "label", "ppo")
"""The parts, in the order they are cut from the shuffled requests."""


def first_human_turns(path: str | Path) -> list[str]:
    """The distinct first human turns of the HH transcripts in ``path`` (JSONL, gzipped or not), in
    file order, stripped; transcripts the HH reader skips are left out."""
    opener = gzip.open if str(path).endswith(".gz") else open
    turns: dict[str, None] = {}
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            try:
                turn = hh_turns(json.loads(line)["chosen"], "chosen")[0]["content"].strip()
            except Skip:
                continue
            turns.setdefault(turn, None)
    return list(turns)


def split_prompts(requests: list[str], sizes: dict[str, int | None], seed: int = SPLIT_SEED) -> dict[str, list[str]]:
    """The requests of at most :data:`MAX_WORDS` words, shuffled by ``seed`` and cut into the
    :data:`PARTS` in order, each of ``sizes[part]`` requests (None: all that are left).

    Raises ``ValueError`` when there are fewer requests than the sizes ask for."""
    short = [r for r in requests if 0 < len(r.split()) <= MAX_WORDS]
    random.Random(seed).shuffle(short)
    parts, start = {}, 0
    for part in PARTS:
        size = sizes.get(part)
        stop = len(short) if size is None else start + size
        if stop > len(short):
            raise ValueError(f"{len(short)} short requests cannot fill the parts {sizes}")
        parts[part] = short[start:stop]
        start = stop
    return parts


def conversation(request: str) -> list[dict[str, str]]:
    """``request`` as a one-turn conversation: the user's message."""
    return [{"role": "user", "content": request}]


def write_prompt_splits(hh_path: str | Path, out_dir: str | Path, sizes: dict[str, int | None]) -> dict[str, str]:
    """Write ``<out_dir>/<part>.jsonl`` for every part of :func:`split_prompts`; returns their paths."""
    parts = split_prompts(first_human_turns(hh_path), sizes)
    paths = {}
    for part, requests in parts.items():
        path = Path(out_dir) / f"{part}.jsonl"
        write_text_atomically(path, "".join(json.dumps({"prompt": conversation(r)}) + "\n" for r in requests))
        paths[part] = str(path)
    return paths


def read_prompt_file(path: str | Path) -> list[list[dict[str, str]]]:
    """The conversations of a file :func:`write_prompt_splits` wrote."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["prompt"] for line in f if line.strip()]

"""TinyStories prompts: blank-line separated paragraphs, their opening words, disjoint ranges."""

from __future__ import annotations

import os
import re

from rlhf_lit.data.adapters import AdapterOptions, Fields, adapt
from rlhf_lit.data.records import Row

RANGES: dict[str, tuple[int, int]] = {
    "sft": (0, 1000),
    "reward_model": (1000, 1500),
    "ppo": (2500, 500),
    "eval": (3000, 256),
}
"""``stage -> (start, count)``: the demo's disjoint paragraph ranges (see the package docstring)."""
READ_AS_EXAMPLES: dict[str, int] = {"sft": 8}
"""``stage -> prompt_words`` of the stages whose file a data module reads as ``paragraphs`` and splits by
``val_fraction`` (configs/demo/sft.yaml): their file holds only the paragraphs that format reads (more than
``prompt_words`` words), so the split, drawn by record position, draws over exactly the examples the stage has."""

_WORD = re.compile(r"\S+")


def read_paragraphs(path: str) -> list[str]:
    """The blank-line separated paragraphs of a text file, each stripped, in file order.

    Whitespace-only lines count as blank (the same rule as the data modules' ``.txt`` reader).
    """
    with open(path, encoding="utf-8") as f:
        text = f.read()
    paragraphs, lines = [], []
    for line in [*text.splitlines(), ""]:
        if line.strip():
            lines.append(line)
        elif lines:
            paragraphs.append("\n".join(lines).strip())
            lines = []
    return paragraphs


def opening_words(paragraph: str, num_words: int) -> str:
    """The first ``num_words`` words of ``paragraph`` with their original spacing.

    The cut is the one the data modules' ``paragraphs`` format makes. A paragraph with fewer
    words is returned whole: it is still a sensible story opening to continue.
    """
    if num_words < 1:
        raise ValueError(f"num_words must be >= 1, got {num_words}")
    words = list(_WORD.finditer(paragraph))
    if not words:
        raise ValueError("empty paragraph")
    return paragraph[: words[min(num_words, len(words)) - 1].end()]


def check_range(start: int, count: int, total: int, path: str) -> None:
    """Raise a clear error unless ``[start, start + count)`` lies inside ``total`` paragraphs."""
    if start < 0 or count < 1:
        raise ValueError(f"need start >= 0 and count >= 1, got start={start}, count={count}")
    if start + count > total:
        raise ValueError(f"paragraphs [{start}, {start + count}) asked for, but {path} has only {total}")


def load_prompts(path: str, start: int, count: int, num_words: int) -> tuple[list[int], list[str]]:
    """``(paragraph indices, prompts)`` for paragraphs ``[start, start + count)`` of ``path``."""
    paragraphs = read_paragraphs(path)
    check_range(start, count, len(paragraphs), path)
    indices = list(range(start, start + count))
    return indices, [opening_words(paragraphs[i], num_words) for i in indices]


def read_as_examples(paragraphs: list[str], prompt_words: int) -> list[str]:
    """The ``paragraphs`` the data modules' ``paragraphs`` format reads as examples with ``prompt_words``
    (:func:`rlhf_lit.data.adapters.adapt` decides; the format skips the others), in order."""
    rows = [Row(f"paragraph {i}", {"text": p}) for i, p in enumerate(paragraphs)]
    options = AdapterOptions(Fields(), prompt_words)
    return [paragraphs[i] for i in adapt(rows, format="paragraphs", kind="sft", options=options).positions]


def write_splits(
    path: str,
    out_dir: str,
    ranges: dict[str, tuple[int, int]] = RANGES,
    read_as_examples_by: dict[str, int] = READ_AS_EXAMPLES,
) -> dict[str, str]:
    """Write each range of paragraphs to ``out_dir/<stage>.txt`` (blank-line separated); a stage of
    ``read_as_examples_by`` (``stage -> prompt_words``) gets only the paragraphs its data module reads
    (:func:`read_as_examples`).

    Returns ``stage -> written path``. Ranges must not overlap.
    """
    spans = sorted((start, start + count, stage) for stage, (start, count) in ranges.items())
    for (_, end_a, a), (start_b, _, b) in zip(spans, spans[1:]):
        if start_b < end_a:
            raise ValueError(f"ranges {a!r} and {b!r} overlap")
    paragraphs = read_paragraphs(path)
    os.makedirs(out_dir, exist_ok=True)
    written = {}
    for stage, (start, count) in ranges.items():
        check_range(start, count, len(paragraphs), path)
        written[stage] = os.path.join(out_dir, f"{stage}.txt")
        kept = paragraphs[start : start + count]
        if stage in read_as_examples_by:
            kept = read_as_examples(kept, read_as_examples_by[stage])
        with open(written[stage], "w", encoding="utf-8") as f:
            f.write("\n\n".join(kept) + "\n")
    return written

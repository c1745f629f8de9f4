"""Reading the prompts of an evaluation from a file: one per line, or JSONL (a string or a conversation per record)."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # annotations only: reading a lines file imports nothing of the data package
    from rlhf_lit.data.conversation import TextOrConversation

PromptFormat = Literal["auto", "lines", "jsonl"]
"""``lines``: one prompt per non-blank line; ``jsonl``: one JSON object per line; ``auto``: by extension."""


def read_prompts(path: str, fmt: PromptFormat = "auto", field_name: str = "prompt") -> list[TextOrConversation]:
    """The prompts of a file, in file order; a ``ValueError`` names the file (and line) when it is unusable.

    Args:
        path: a text file (one prompt per line; blank lines skipped, the line kept as written
            without its line break) or JSONL (one object per non-blank line, the prompt in
            ``field_name``: a non-empty string, or a list of messages ending with the user's turn,
            as the data modules read conversational prompts; the policy's chat template renders
            it, :mod:`rlhf_lit.data.prompt_rendering`).
        fmt: ``auto`` reads ``*.jsonl`` as JSONL and anything else as lines.
        field_name: the JSONL field that holds the prompt.
    """
    if not os.path.isfile(path):
        raise ValueError(f"--prompts {path}: no such file")
    if fmt == "auto":
        fmt = "jsonl" if path.endswith(".jsonl") else "lines"
    prompts = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            if fmt == "lines":
                prompts.append(line)
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} line {number}: not JSON ({e.msg})") from None
            if not isinstance(record, dict) or field_name not in record:
                raise ValueError(f"{path} line {number}: no {field_name!r} field (choose it with --prompt-field)")
            prompt = record[field_name]
            if isinstance(prompt, list):
                prompts.append(_conversation(path, number, field_name, prompt))
                continue
            if not isinstance(prompt, str) or not prompt.strip():
                raise ValueError(
                    f"{path} line {number}: {field_name!r} is not a non-empty string or a list of messages"
                )
            prompts.append(prompt)
    if not prompts:
        raise ValueError(f"{path}: no prompts in the file")
    return prompts


def _conversation(path: str, number: int, field_name: str, messages: list):
    """A conversational prompt, checked as the data modules check one (errors name the file, line and message)."""
    from rlhf_lit.data.conversation import require_prompt_end, text_or_conversation
    from rlhf_lit.data.records import Row

    row = Row(f"{path} line {number}", {field_name: messages})
    prompt = text_or_conversation(row, field_name, messages)
    require_prompt_end(row, field_name, prompt)
    return prompt

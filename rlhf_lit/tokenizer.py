"""Tokenizer loading with an explicit, logged policy for tokenizers that have no pad token."""

from __future__ import annotations

import logging
from typing import Literal

from transformers import AutoTokenizer, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

MissingPad = Literal["add", "eos", "unk", "error"]
"""What to do when a tokenizer has no pad token.

- ``"add"``: add a new ``<|pad|>`` special token (the model's embeddings are resized to match).
  A pad distinct from EOS is what "The N Implementation Details of RLHF" recommend.
- ``"eos"``: reuse the EOS token. rlhf-lit never derives masks from pad ids, so this is safe
  inside rlhf-lit, but Hugging Face's own sequence-classification pooling (used when an exported
  reward model is loaded elsewhere) then skips a trailing EOS.
- ``"unk"``: reuse the UNK token.
- ``"error"``: refuse.
"""

ADDED_PAD_TOKEN = "<|pad|>"


def load_tokenizer(
    name_or_path: str,
    padding_side: Literal["left", "right"] = "right",
    missing_pad: MissingPad = "add",
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> PreTrainedTokenizerBase:
    """Load a tokenizer from a hub name or a local directory and make sure it can pad.

    Args:
        name_or_path: Hugging Face hub name or a local directory.
        padding_side: Side on which batches are padded. Generation needs ``"left"``.
        missing_pad: Policy when the tokenizer defines no pad token (see :data:`MissingPad`).
            The choice is logged; it is never made silently.
        revision: Hub revision (branch, tag or commit).
        trust_remote_code: Passed to ``AutoTokenizer.from_pretrained``.

    Returns:
        The tokenizer, with ``pad_token`` set and ``padding_side`` as asked.
    """
    tokenizer = AutoTokenizer.from_pretrained(
        name_or_path, revision=revision, trust_remote_code=trust_remote_code
    )
    if tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer {name_or_path!r} has no EOS token; rlhf-lit ends responses with EOS")
    if tokenizer.pad_token_id is None:
        if missing_pad == "error":
            raise ValueError(f"tokenizer {name_or_path!r} has no pad token and missing_pad='error'")
        if missing_pad == "add":
            tokenizer.add_special_tokens({"pad_token": ADDED_PAD_TOKEN})
        elif missing_pad == "eos":
            tokenizer.pad_token = tokenizer.eos_token
        elif missing_pad == "unk":
            if tokenizer.unk_token is None:
                raise ValueError(f"tokenizer {name_or_path!r} has no pad and no UNK token; use missing_pad='add'")
            tokenizer.pad_token = tokenizer.unk_token
        else:
            raise ValueError(f"missing_pad must be one of add, eos, unk, error; got {missing_pad!r}")
        log.warning(
            "tokenizer %s has no pad token: missing_pad=%r set pad_token=%r (id %d)",
            name_or_path, missing_pad, tokenizer.pad_token, tokenizer.pad_token_id,
        )
    tokenizer.padding_side = padding_side
    return tokenizer

"""Tokenizer loading with an explicit, logged policy for tokenizers that have no pad token, and the one
vocabulary of "render strings with the chat template?" (:data:`TemplateChoice`; resolved for a
tokenizer by :func:`rlhf_lit.data.rendering.resolve_template`)."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Mapping
from typing import Any, Literal, get_args

from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase

from rlhf_lit.option_values import check_choice
from rlhf_lit.sources import TOKENIZER_FILES, DamagedSource, SourceError, from_pretrained, unloadable_tokenizer

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


# Why these words: each option asks one yes/no question, "render these strings with the chat
# template?", and auto | always | never answers it under any option name, as in `--color
# auto|always|never` (git, ls, grep). The other spelling, auto | chat_template | raw, stutters under
# the option that most needs it (`--chat-template chat_template`, `chat_template: chat_template`).
TemplateChoice = Literal["auto", "always", "never"]
"""Whether strings are rendered with the tokenizer's chat template: ``auto`` (the default) when the
tokenizer has one, ``always`` (a tokenizer without one is refused), ``never`` (kept as written)."""

TEMPLATE_CHOICES: tuple[str, ...] = get_args(TemplateChoice)
"""The canonical values of :data:`TemplateChoice`, for option parsers and messages."""

TEMPLATE_ALIASES: Mapping[str, TemplateChoice] = {"chat_template": "always", "raw": "never"}
"""Deprecated, removed in 0.3.0: ``hh_render``'s older spelling (``auto | chat_template | raw``), taken by every
:data:`TemplateChoice` option and mapped here only, by :func:`template_choice` (resumed checkpoints too)."""

TemplateOption = TemplateChoice | str
"""What an option's annotation accepts: a :data:`TemplateChoice`, or an alias (or a typo) that
:func:`template_choice` maps or refuses with the option's own one-line message."""


def template_choice(value: Any, name: str) -> TemplateChoice:
    """``value`` of the option ``name`` as its canonical :data:`TemplateChoice` (a deprecated alias,
    removed in 0.3.0, mapped by :data:`TEMPLATE_ALIASES`); ``ValueError`` naming ``name`` and the
    canonical choices otherwise."""
    choice = TEMPLATE_ALIASES.get(value, value) if isinstance(value, str) else value
    check_choice(name, choice, TEMPLATE_CHOICES)  # an alias maps into the choices: a refused value is as given
    return choice


APPLY_CHAT_TEMPLATE: Mapping[bool, TemplateChoice] = {True: "always", False: "never"}
"""Deprecated, removed in 0.3.0: the data modules' yes/no ``apply_chat_template``, their option before
``chat_template``; mapped here only, read by :func:`data_template_choice` and by the resume check (checkpoints
whose data hyperparameters record it)."""


def data_template_choice(chat_template: Any, apply_chat_template: bool | None) -> TemplateChoice:
    """A data module's ``chat_template`` as its canonical :data:`TemplateChoice`, or its deprecated alias
    ``apply_chat_template`` (removed in 0.3.0; a ``FutureWarning`` says so) mapped by :data:`APPLY_CHAT_TEMPLATE`.
    ``ValueError`` naming both when both are given (``chat_template`` other than its default ``auto``)."""
    if apply_chat_template is None:
        return template_choice(chat_template, "chat_template")
    if chat_template != "auto":
        raise ValueError(
            f"give chat_template ({chat_template}) or apply_chat_template ({apply_chat_template}), not both: "
            "apply_chat_template is its deprecated alias, removed in 0.3.0 (true: always, false: never)"
        )
    warnings.warn(
        "apply_chat_template is deprecated, removed in 0.3.0: write chat_template: always for true, never for false",
        FutureWarning,
        stacklevel=4,  # the data module's caller: here <- _init_common <- its __init__ <- the caller
    )
    return APPLY_CHAT_TEMPLATE[bool(apply_chat_template)]


def load_tokenizer(
    name_or_path: str,
    padding_side: Literal["left", "right"] = "right",
    missing_pad: MissingPad = "add",
    revision: str | None = None,
    trust_remote_code: bool = False,
    what: str = "tokenizer",
) -> PreTrainedTokenizerBase:
    """Load a tokenizer from a hub name or a local directory and make sure it can pad.

    Args:
        name_or_path: Hugging Face hub name or a local directory.
        padding_side: Side on which batches are padded. Generation needs ``"left"``.
        missing_pad: Policy when the tokenizer defines no pad token (see :data:`MissingPad`).
            The choice is logged; it is never made silently.
        revision: Hub revision (branch, tag or commit).
        trust_remote_code: Passed to ``AutoTokenizer.from_pretrained``.
        what: names the source in error messages (e.g. the option it came from).

    Returns:
        The tokenizer, with ``pad_token`` set and ``padding_side`` as asked.
    """
    tokenizer = from_pretrained(
        AutoTokenizer.from_pretrained,
        name_or_path,
        what,
        "tokenizer",
        revision=revision,
        trust_remote_code=trust_remote_code,
    )
    if tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer {name_or_path!r} has no EOS token; rlhf-lit ends responses with EOS")
    if tokenizer.pad_token_id is None:
        check_choice("missing_pad", missing_pad, get_args(MissingPad))
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
        log.warning(
            "tokenizer %s has no pad token: missing_pad=%r set pad_token=%r (id %d)",
            name_or_path,
            missing_pad,
            tokenizer.pad_token,
            tokenizer.pad_token_id,
        )
    tokenizer.padding_side = padding_side
    return tokenizer


def _base_vocabulary(tokenizer: PreTrainedTokenizerBase) -> dict[str, int]:
    """The tokenizer's own vocabulary, without tokens added on top (such as rlhf-lit's pad)."""
    return {token: i for token, i in tokenizer.get_vocab().items() if i < tokenizer.vocab_size}


def _saved_tokenizer(model_path: str, what: str) -> PreTrainedTokenizerBase | None:
    """The tokenizer saved with a model (a local directory with tokenizer files, or a hub name), or None.

    Tokenizer files that are there and do not load raise :class:`DamagedSource` (never "no tokenizer")."""
    local = os.path.isdir(os.path.expanduser(model_path))
    if local and not any(os.path.exists(os.path.join(os.path.expanduser(model_path), f)) for f in TOKENIZER_FILES):
        return None
    try:
        return from_pretrained(AutoTokenizer.from_pretrained, model_path, what, "tokenizer")
    except DamagedSource:
        raise  # a damaged tokenizer is not "no tokenizer": never compared as if absent
    except (OSError, ValueError, TypeError, SourceError) as error:
        damaged = unloadable_tokenizer(model_path, what, error) if local else None
        if damaged is not None:
            raise damaged from None
        return None


def check_same_chat_template(tokenizer: PreTrainedTokenizerBase, model_path: str, what: str) -> None:
    """Refuse a reward model that was not trained on conversations rendered as the policy's are.

    When the prompts are rendered with the policy tokenizer's chat template, the reward model reads
    the policy's token ids as they are: the rendered conversation, generation prompt and markup
    included. It scores them the way it was trained only if its own tokenizer (saved with it, as
    every rlhf-lit export is) renders with the same template. A model saved without a tokenizer
    cannot be checked and passes.

    Raises:
        ValueError: the templates differ, or the reward model's tokenizer has none.
    """
    theirs = _saved_tokenizer(model_path, what)
    if theirs is None or theirs.chat_template == tokenizer.chat_template:
        return
    how = "has no chat template" if not theirs.chat_template else "has a chat template other than the policy's"
    raise ValueError(
        f"{what} {model_path}: its tokenizer {how}, and the prompts are rendered with the policy's template: it "
        "would score conversations rendered otherwise than it was trained on. Train it from the SFT export (same "
        "tokenizer and template) on conversational pairs"
    )


def check_same_vocabulary(tokenizer: PreTrainedTokenizerBase, model_path: str, what: str, model_vocab: int) -> None:
    """Refuse a model (reward model, value model) that does not read the run's token ids as its own.

    The policy's token ids are passed to the reward model as they are, never decoded and
    re-encoded (which would change them: "BPE is not a bijection"), so both must share one
    vocabulary. A model directory with a tokenizer is compared token by token (tokens added on
    top, such as a pad, aside); one without must have an embedding table no smaller than the
    tokenizer's vocabulary and no larger than the policy's (``model_vocab``).

    Raises:
        ValueError: the vocabularies differ, naming both sizes.
    """
    theirs = _saved_tokenizer(model_path, what)
    if theirs is not None:
        if _base_vocabulary(theirs) == _base_vocabulary(tokenizer):
            return
        sizes = f"{theirs.vocab_size} vs {tokenizer.vocab_size} tokens"
    else:
        size = AutoConfig.from_pretrained(model_path).vocab_size
        # Its embeddings may hold the run's added pad or be padded to a round size, as the policy's may.
        if tokenizer.vocab_size <= size <= max(len(tokenizer), model_vocab):
            return
        sizes = f"{size} vs {tokenizer.vocab_size} token embeddings"
    raise ValueError(
        f"{what} {model_path} has a different vocabulary from the policy's tokenizer ({sizes}): it would read "
        "the policy's token ids as other tokens. Use a model trained with the policy's tokenizer (for example "
        "the reward-model stage's export from the SFT model)"
    )

"""Supervised fine-tuning data: (prompt, response) pairs -> right padded batches whose labels
count only the response tokens and the EOS that ends them; whole conversations -> labels on the
assistant's turns."""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader

from rlhf_lit.data.adapters import Example, Fields, SFTFormat
from rlhf_lit.data.base import TextDataModule, check_lengths
from rlhf_lit.data.chat import AssistantTurns
from rlhf_lit.data.collate import SFTCollator
from rlhf_lit.data.encoding import TextEncoder
from rlhf_lit.data.rendering import TemplateOption


class SFTDataModule(TextDataModule):
    """(prompt, response) demonstrations, or whole conversations, for supervised fine-tuning.

    Batches (right padded): ``input_ids``, ``attention_mask``, ``labels``, each ``(B, T)``;
    ``labels`` is -100 on prompt and padding positions and the token id on response positions,
    including the EOS that ends a response. A conversation (``messages`` records) is rendered
    whole with the tokenizer's chat template; its labels count the assistant's turns
    (``assistant_turns``) and the end of turn the template writes in them, -100 elsewhere
    (:mod:`rlhf_lit.data.chat`).

    Truncation: the prompt is truncated from the LEFT to ``max_prompt_length`` tokens (keeping
    its end, nearest to the response; BOS-like specials stay in front); the response is truncated
    from the right so that prompt + response + EOS <= ``max_length``. A response that does not fit
    whole with its EOS is cut to fill ``max_length`` and gets no EOS (it did not end). Examples
    whose response keeps no token are dropped, counted and logged once. Details in
    ``rlhf_lit.data.encoding``; formats in ``rlhf_lit.data.adapters``.

    Args:
        tokenizer: Hugging Face tokenizer; set by the CLI from the model stage (must have a pad
            token). Required by ``setup``.
        train_path: training data: a local file (.jsonl, .json, .txt, optionally .gz) if it
            exists, else a Hugging Face hub dataset name (needs ``pip install 'rlhf-lit[hub]'``).
            A path-like string (``./``, ``../``, ``/``, or a data suffix) that does not exist is
            an error, never a hub lookup.
        val_path: validation data from a separate source (same rules as ``train_path``).
        val_fraction: else hold out this fraction of the training examples (seeded by ``seed``);
            0 means no validation. Giving it together with ``val_path`` is an error.
        val_split: the hub split of the validation data, e.g. ``test`` (HH-RLHF) or ``test_prefs``
            (UltraFeedback): of ``val_path``, or without ``val_path`` of ``train_path``'s dataset. None:
            ``val_path`` is read with ``split``. A local file has no splits, and a split is not held out
            beside ``val_fraction``: both are errors naming the option.
        seed: seed of the validation split and of the training shuffle; None: the run's
            ``seed_everything`` (:mod:`rlhf_lit.run_seed`), so another run seed holds out other
            examples and shuffles them in another order.
        format: record format: ``auto`` (detected from the first record, :mod:`rlhf_lit.data.detect`;
            pairs and rankings are refused: set their format) or one of the registry
            :data:`rlhf_lit.data.adapters.ADAPTERS` that gives SFT examples (what each reads and
            trains: :mod:`rlhf_lit.data.adapters`). ``val_path`` is read in the format of ``train_path``.
        fields: column names of the records (every format but ``alpaca``).
        split: hub split to read.
        subset: hub dataset configuration (subset) name.
        max_records: read at most this many records per source (None: all).
        skip_invalid: skip (and count, log once) lines that do not parse and records with a
            missing, non-string or empty field, instead of raising.
        prompt_words: words in the prompt for the ``paragraphs`` format.
        chat_template: whether string prompts are rendered as a user turn (with the generation
            prompt) and string responses as the assistant turn with the tokenizer's chat template
            (:data:`rlhf_lit.data.rendering.TemplateChoice`): ``auto`` when the tokenizer has one (but
            ``hh_rlhf`` and ``text`` strings, :data:`~rlhf_lit.data.rendering.KEPT_BY_AUTO`), ``always``
            (an error if it has none), ``never``. Conversations are always rendered with it. One INFO
            line per source says which was used and why.
        hh_render: how ``hh_rlhf`` transcripts are rendered
            (:data:`rlhf_lit.data.rendering.TemplateChoice`: ``auto``, with the chat template when the
            tokenizer has one; ``always``; ``never``, kept as strings; ``chat_template`` and ``raw`` are
            deprecated aliases of ``always`` and ``never``, removed in 0.3.0), for every source read as
            ``hh_rlhf``. One INFO line says which was used and why.
        assistant_turns: which assistant turns of a conversation (``messages``) are trained:
            ``all`` of them, or the ``last`` one only (the earlier ones are context).
        max_length: the most tokens of prompt + response + EOS (of a whole conversation).
        max_prompt_length: the most prompt tokens (must be below ``max_length``); for a
            conversation, the tokens before its first trained token.
        batch_size: examples per batch.
        num_workers: DataLoader worker processes.
        apply_chat_template: deprecated alias of ``chat_template``, removed in 0.3.0: ``true`` is
            ``always``, ``false`` ``never`` (a warning says so; given with ``chat_template`` an error).
    """

    kind = "sft"

    def __init__(
        self,
        *,
        tokenizer: Any = None,
        train_path: str,
        val_path: str | None = None,
        val_fraction: float = 0.0,
        val_split: str | None = None,
        seed: int | None = None,
        format: SFTFormat = "auto",
        fields: Fields = Fields(),
        split: str = "train",
        subset: str | None = None,
        max_records: int | None = None,
        skip_invalid: bool = False,
        prompt_words: int = 8,
        chat_template: TemplateOption = "auto",
        hh_render: TemplateOption = "auto",
        assistant_turns: AssistantTurns = "all",
        max_length: int = 512,
        max_prompt_length: int = 256,
        batch_size: int = 8,
        num_workers: int = 0,
        apply_chat_template: bool | None = None,
    ):
        super().__init__()
        check_lengths(max_prompt_length, max_length)
        self._init_common(locals())
        if assistant_turns not in ("all", "last"):
            raise ValueError(f"assistant_turns must be 'all' or 'last', got {assistant_turns!r}")
        if assistant_turns == "all":
            # stored only when set, so that a checkpoint written before the option resumes (its check compares them)
            del self.hparams["assistant_turns"]

    def _encode(self, encoder: TextEncoder, examples: list[Example]) -> list[dict[str, Any]]:
        return self._demonstrations(encoder, examples, self.assistant_turns, self.max_length)

    def train_dataloader(self) -> DataLoader:
        return self._shuffled_train_loader(SFTCollator(self.pad_token_id))

    def val_dataloader(self) -> DataLoader | list:
        return self._val_loader(SFTCollator(self.pad_token_id))

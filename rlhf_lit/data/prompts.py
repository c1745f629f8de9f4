"""Prompts for PPO rollouts: left padded batches with the dataset row ``index``, drawn by a
resumable sampler so that a resumed run continues with exactly the prompts it had not used; and
the optional PPO-ptx source, SFT batches that PPO mixes into its loss."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader

from rlhf_lit.data.adapters import Example, Fields, PromptFormat, SFTFormat, check_extra_fields
from rlhf_lit.data.base import TextDataModule, check_sft_source
from rlhf_lit.data.collate import PromptCollator, SFTCollator
from rlhf_lit.data.encoding import TextEncoder, require_tokenizer, truncate_prompt
from rlhf_lit.data.rendering import TemplateOption
from rlhf_lit.data.sampler import PassSampler
from rlhf_lit.option_values import check_least


class PromptDataModule(TextDataModule):
    """Prompts for PPO.

    Batches (left padded, so generation appends on the right): ``input_ids (B, P)``,
    ``attention_mask (B, P)``, ``index (B,)`` (row of the prompt in its dataset). Prompts are
    truncated from the LEFT to ``max_prompt_length`` tokens (BOS-like specials stay in front). A
    conversational prompt (a list of messages) is rendered by the tokenizer's chat template with
    the generation prompt, so its ids end with the template's assistant header.

    Exact resume: the training loader draws from a :class:`ResumableSampler` (a permutation per
    epoch seeded with ``seed + epoch``). The consumer (the PPO stage) reports the prompts it has
    used with :meth:`mark_consumed` after each rollout (the DataLoader prefetches, so the sampler
    cannot count this itself); :meth:`state_dict` / :meth:`load_state_dict` (saved into Lightning
    checkpoints) carry the epoch and that count, and a resumed run skips exactly those prompts.

    PPO-ptx (InstructGPT's pretraining mix, eq. 2): with ``ptx_path``, ``ptx_dataloader()`` gives
    a re-iterable DataLoader of SFT batches (right padded ``input_ids``, ``attention_mask``,
    ``labels`` with -100 on prompt and padding; built exactly as ``SFTDataModule`` builds them,
    with ``max_prompt_length`` and ``ptx_max_length``), in a new seeded order on every pass
    (:class:`PassSampler`, seeded by ``seed``) and sharded over processes. Its position is not
    saved in checkpoints: a resumed run starts the ptx stream again. Without ``ptx_path`` the
    module has no ``ptx_dataloader`` attribute at all (reading it raises ``AttributeError`` with
    the reason), so the PPO stage refuses ``ptx_coef > 0`` before training starts.

    Args:
        tokenizer: Hugging Face tokenizer; set by the CLI from the model stage (must have a pad
            token). Required by ``setup``.
        train_path: prompts: a local file (.jsonl, .json, .txt, optionally .gz) if it exists,
            else a Hugging Face hub dataset name (needs ``pip install 'rlhf-lit[hub]'``). A
            path-like string that does not exist is an error, never a hub lookup.
        val_path: validation prompts from a separate source (same rules as ``train_path``).
        val_fraction: else hold out this fraction of the prompts (seeded by ``seed``); 0 means
            no validation. Giving it together with ``val_path`` is an error.
        val_split: the hub split of the validation data, e.g. ``test`` (HH-RLHF) or ``test_prefs``
            (UltraFeedback): of ``val_path``, or without ``val_path`` of ``train_path``'s dataset. None:
            ``val_path`` is read with ``split``. A local file has no splits, and a split is not held out
            beside ``val_fraction``: both are errors naming the option.
        seed: seed of the validation split, of the per-epoch permutation and of the ptx order;
            None: the run's ``seed_everything`` (:mod:`rlhf_lit.run_seed`), so another run seed
            draws the prompts in another order.
        format: record format: ``auto`` (detected from the first record as the other data modules
            detect it, :mod:`rlhf_lit.data.detect`; a ``text`` column or a ``.txt`` file is
            ``paragraphs``) or one of the registry :data:`rlhf_lit.data.adapters.ADAPTERS` that gives
            prompts (the prompt each reads: :mod:`rlhf_lit.data.adapters`). ``val_path`` is read in
            the format of ``train_path``.
        fields: column names of the records.
        split: hub split to read.
        subset: hub dataset configuration (subset) name.
        max_records: read at most this many records per source (None: all).
        skip_invalid: skip (and count, log once) lines that do not parse and records with a
            missing, non-string or empty field, instead of raising.
        prompt_words: words in the prompt for the ``paragraphs`` format.
        chat_template: whether each string prompt is rendered as a user turn with the generation
            prompt, with the tokenizer's chat template, as ``SFTDataModule``'s (``ptx_path`` too).
        hh_render: how ``hh_rlhf`` transcripts are rendered
            (:data:`rlhf_lit.data.rendering.TemplateChoice`: ``auto``, with the chat template when the
            tokenizer has one; ``always``; ``never``, kept as strings; ``chat_template`` and ``raw`` are
            deprecated aliases of ``always`` and ``never``, removed in 0.3.0), for every source read as
            ``hh_rlhf`` (``ptx_path`` too). One INFO line says which was used and why.
        max_prompt_length: the most tokens of a prompt.
        batch_size: prompts per batch (per rollout).
        shuffle: draw the training prompts in a seeded random order per epoch (else in order).
        drop_last: drop the last incomplete training batch of an epoch, so every rollout has
            ``batch_size`` prompts.
        num_workers: DataLoader worker processes.
        ptx_path: SFT-style data for PPO-ptx (prompt + response; e.g. the SFT data or plain text
            paragraphs); same source rules as ``train_path``. None: no ptx data.
        ptx_format: record format of ``ptx_path``, read as SFT examples: ``auto`` (detected from
            its first record as ``SFTDataModule`` detects it; a ``.txt`` file is ``paragraphs``, a
            ``text`` column ``text``) or one of the registry :data:`rlhf_lit.data.adapters.ADAPTERS`
            that gives SFT examples (:mod:`rlhf_lit.data.adapters`).
        ptx_max_records: read at most this many ptx records (None: all).
        ptx_batch_size: ptx examples per PPO minibatch, per process; None: ``batch_size``.
        ptx_max_length: the most tokens of a ptx prompt + response + EOS (its prompt is cut to
            ``max_prompt_length``, which must be below this).
        extra_fields: columns of the prompt records passed through unchanged to the batch as
            ``batch["extras"][name]`` (a list per column, one value per prompt; never tensors), and
            from there to reward functions as ``RewardBatch.extras`` (e.g. ``[ground_truth]``).
            Every record must have them.
        apply_chat_template: deprecated alias of ``chat_template``, removed in 0.3.0: ``true`` is
            ``always``, ``false`` ``never`` (a warning says so; given with ``chat_template`` an error).
    """

    kind = "prompt"
    shuffle_order = "seed_per_epoch"

    def __init__(
        self,
        *,
        tokenizer: Any = None,
        train_path: str,
        val_path: str | None = None,
        val_fraction: float = 0.0,
        val_split: str | None = None,
        seed: int | None = None,
        format: PromptFormat = "auto",
        fields: Fields = Fields(),
        split: str = "train",
        subset: str | None = None,
        max_records: int | None = None,
        skip_invalid: bool = False,
        prompt_words: int = 8,
        chat_template: TemplateOption = "auto",
        hh_render: TemplateOption = "auto",
        max_prompt_length: int = 256,
        batch_size: int = 8,
        shuffle: bool = True,
        drop_last: bool = True,
        num_workers: int = 0,
        ptx_path: str | None = None,
        ptx_format: SFTFormat = "auto",
        ptx_max_records: int | None = None,
        ptx_batch_size: int | None = None,
        ptx_max_length: int = 512,
        extra_fields: list[str] | None = None,
        apply_chat_template: bool | None = None,
    ):
        super().__init__()
        check_least("max_prompt_length", max_prompt_length, 1)
        self._init_common(locals())
        check_sft_source("ptx", ptx_path, ptx_format, max_records=ptx_max_records, batch_size=ptx_batch_size)
        if ptx_path is not None and not max_prompt_length < ptx_max_length:
            raise ValueError(
                f"ptx examples need max_prompt_length < ptx_max_length, got max_prompt_length="
                f"{max_prompt_length}, ptx_max_length={ptx_max_length}"
            )
        self.extra_fields = check_extra_fields(extra_fields)
        self.ptx_dataset: list[dict[str, Any]] | None = None
        if ptx_path is None:
            self._record_format("ptx_format", None)

    def _encode(self, encoder: TextEncoder, examples: list[Example]) -> list[dict[str, Any]]:
        ids = encoder.encode_prompts([e.prompt for e in examples])
        items = [
            {"input_ids": truncate_prompt(p, encoder.prefix, self.max_prompt_length, self.truncated), "index": i}
            for i, p in enumerate(ids)
        ]
        if self.extra_fields:
            for item, example in zip(items, examples):
                item["extras"] = example.extras
        return items

    def train_dataloader(self) -> DataLoader:
        return self._train_loader(PromptCollator(self.pad_token_id), drop_last=self.drop_last)

    def val_dataloader(self) -> DataLoader | list:
        return self._val_loader(PromptCollator(self.pad_token_id))

    def end_of_turn_id(self) -> int | None:
        """The id the tokenizer's chat template ends an assistant turn with
        (:meth:`~rlhf_lit.data.encoding.TextEncoder.end_of_turn_id`; None when it ends with no special
        token). PPO asks it of a ``chat_rendered`` data module and refuses an end of turn that does not
        stop generation: the stage reads it here because stages never import the data package."""
        tokenizer = require_tokenizer(self.tokenizer, type(self).__name__)
        return TextEncoder(tokenizer, apply_chat_template=True).end_of_turn_id()

    # ----------------------------------------------------------------------------------- ptx
    def _setup_extra(self) -> None:
        self.ptx_dataset = self._sft_source("ptx", self.ptx_max_length)

    @property
    def ptx_dataloader(self) -> Callable[[], DataLoader]:
        """``ptx_dataloader()``: the PPO-ptx SFT batches (see the class docstring). Exists only
        when ``ptx_path`` is set; otherwise reading it raises ``AttributeError`` saying so, and
        ``hasattr(dm, "ptx_dataloader")`` is False."""
        if self.ptx_path is None:
            raise AttributeError(
                "PromptDataModule has no ptx_dataloader: ptx_path is not set (PPO-ptx, "
                "ppo.ptx_coef > 0, needs SFT-style data: set data ptx_path)"
            )
        return self._ptx_dataloader

    def _ptx_dataloader(self) -> DataLoader:
        self._require_setup()
        assert self.ptx_dataset is not None  # set by setup() since ptx_path is set
        sampler = PassSampler(len(self.ptx_dataset), seed=self.seed)
        return self._loader(
            self.ptx_dataset, SFTCollator(self.pad_token_id), batch_size=self.ptx_batch_size, sampler=sampler
        )

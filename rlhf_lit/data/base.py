"""What the three data modules share: argument checks, reading and adapting the train and
validation sources, tokenizing once in ``setup``, and the training order, exactly resumable.

Exact resume: every training loader draws from a :class:`~rlhf_lit.data.sampler.ResumableSampler`.
The stage that trains on the batches reports the examples it has taken with
:meth:`TextDataModule.mark_consumed` (the DataLoader prefetches, so the sampler cannot count this
itself); :meth:`TextDataModule.state_dict` / :meth:`TextDataModule.load_state_dict` (saved into
Lightning checkpoints) carry the epoch and that count, and a resumed run skips exactly those
examples, also in the middle of an epoch."""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, ClassVar

import lightning as L
import torch
from torch.utils.data import DataLoader

from rlhf_lit.data.adapters import AUTO, Example, Fields, Kind, check_fields, check_format
from rlhf_lit.data.chat import AssistantTurns
from rlhf_lit.data.collate import require_pad_id
from rlhf_lit.data.conversation import is_conversation
from rlhf_lit.data.demonstrations import encode_demonstrations, refused_conversation, template_errors
from rlhf_lit.data.encoding import TextEncoder, require_tokenizer
from rlhf_lit.data.reading import SourceExamples, check_val_split, read_examples, validation_source
from rlhf_lit.data.rendering import (
    TemplateRendering,
    hh_rendering_line,
    holds_strings,
    raw_prompt_warning,
    recorded_choice,
    renders_strings,
    resolve_template,
    string_rendering_line,
    template_choice,
)
from rlhf_lit.data.sampler import ResumableSampler, ShuffleOrder
from rlhf_lit.data.splits import split_by_fraction
from rlhf_lit.option_values import check_least, check_seed
from rlhf_lit.run_seed import seed_or_run_seed
from rlhf_lit.tokenizer import data_template_choice

TRUNCATION_MESSAGES = {
    "prompt": "were longer than max_prompt_length: their start was cut",
    "response": "did not fit in max_length: cut at the end, without EOS",
    "chosen response": "did not fit in max_length: cut at the end, without EOS",
    "rejected response": "did not fit in max_length: cut at the end, without EOS",
    "conversation": "did not fit in max_length: cut at the end",
}
"""How each kind of cut is reported (counted by the truncation rule, :mod:`rlhf_lit.data.encoding`)."""

log = logging.getLogger("rlhf_lit.data")

LATER_COLUMNS = ("responses", "ranks", "completion", "messages")
"""The :class:`Fields` columns added after checkpoints were first written (for rankings, prompt /
completion and conversations): stored in the hyperparameters only when set (:meth:`TextDataModule._keep_hparams`)."""
LEGACY_FORMAT = "fields"
"""The default of every ``format`` option before ``auto``: what older checkpoints hold for an unused source."""


def check_lengths(max_prompt_length: int, max_length: int) -> None:
    """The one error for a prompt length that leaves no room for a response."""
    if not 1 <= max_prompt_length < max_length:
        raise ValueError(
            f"need 1 <= max_prompt_length < max_length, got max_prompt_length="
            f"{max_prompt_length}, max_length={max_length}"
        )


def check_sft_source(name: str, path: str | None, format: str, **counts: int | None) -> None:
    """Clear errors for the options of a second source of SFT-style examples named ``name``
    (``reference`` or ``ptx``): a format that has no SFT examples, or a count option (``counts``:
    ``max_records``, ``batch_size``, each ``<name>_<option>``) below 1 or given without the source."""
    check_format(format, "sft")
    for option, value in counts.items():
        if value is not None:
            if value < 1:
                raise ValueError(f"{name}_{option} must be >= 1 or None, got {value}")
            if path is None:
                raise ValueError(f"{name}_{option}={value} is set but {name}_path is not")


class PositionedLoader(DataLoader):
    """A training DataLoader whose position its data module keeps (:meth:`TextDataModule.state_dict`).

    It has no state of its own; its ``state_dict`` / ``load_state_dict`` tell Lightning that it is
    resumable, so a resume in the middle of an epoch is not reported as unreliable (Lightning's
    warning looks at the loader only).
    """

    def state_dict(self) -> dict[str, Any]:
        """Nothing: the position is in the data module's state, saved beside it."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Nothing to restore here (see :meth:`state_dict`)."""


class TextDataModule(L.LightningDataModule):
    """Base class; subclasses set ``kind``, store their own options, and implement
    ``_encode`` and the dataloaders (the training one with :attr:`sampler`)."""

    kind: ClassVar[Kind]
    shuffle_order: ClassVar[ShuffleOrder] = "dataloader"
    """How the training examples are permuted each epoch (:data:`~rlhf_lit.data.sampler.ShuffleOrder`):
    by default the order a seeded shuffling DataLoader gives, which these modules used before
    their position was saved in checkpoints."""

    def _init_common(self, arguments: Mapping[str, Any]) -> None:
        """Keep every argument of the data module's constructor (``arguments``: its ``locals()``) as the
        attribute of its name, check the options every data module takes, and save the arguments as
        the hyperparameters (:meth:`_keep_hparams`). A module without ``prompt_words`` reads 1, one
        without ``shuffle`` (an option of PromptDataModule only) shuffles. ``chat_template`` is kept
        canonical, its deprecated alias ``apply_chat_template`` (removed in 0.3.0) read into it."""
        self.prompt_words, self.shuffle = 1, True
        for name, value in arguments.items():
            if name not in ("self", "__class__", "apply_chat_template"):
                setattr(self, name, value)
        self.chat_template = data_template_choice(self.chat_template, arguments["apply_chat_template"])
        check_format(self.format, self.kind)
        template_choice(
            self.hh_render, "hh_render"
        )  # a bad value refused here, not at setup; kept as given for the log
        if self.val_path is not None and self.val_fraction > 0:
            raise ValueError(
                f"give either val_path ({self.val_path!r}) or val_fraction ({self.val_fraction}), not both"
            )
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        check_val_split(self.train_path, self.val_path, self.val_split, self.val_fraction)
        for name in ("batch_size", "prompt_words"):
            check_least(name, getattr(self, name), 1)
        check_least("num_workers", self.num_workers, 0)
        if self.max_records is not None and self.max_records < 1:
            raise ValueError(f"max_records must be >= 1 or None, got {self.max_records}")
        # Resolved now (LightningCLI has called seed_everything by the time it builds the module);
        # the hyperparameters keep the option as given (None), the checkpoint the run seed.
        self.seed = seed_or_run_seed(self.seed)
        check_seed("seed", self.seed)
        self.fields = Fields(**self.fields) if isinstance(self.fields, Mapping) else self.fields
        check_fields(self.format, self.fields)
        self._hh: TemplateRendering | None = None  # hh_render for the tokenizer, resolved in setup (read_splits)
        self._hh_noted = False  # the HH rendering logged (once per read_splits)
        self._strings: TemplateRendering | None = None  # chat_template for the tokenizer, resolved in setup
        self._rendered: list[bool] = []  # per source of string examples: rendered (recorded_choice)
        self.sampler: ResumableSampler | None = None  # the training order, built in setup
        self._pending_state: dict[str, Any] | None = None  # a checkpoint's position, loaded before setup
        self.pad_token_id: int | None = None  # from the tokenizer, in setup
        self.train_dataset: list[dict[str, Any]] | None = None
        self.val_dataset: list[dict[str, Any]] | None = None
        self.chat_rendered = self.chat_template == "always"
        """Whether the prompts are rendered with the tokenizer's chat template: with ``chat_template:
        always``, and after ``setup`` when the training or validation prompts are conversations or strings
        ``chat_template`` rendered (PPO then checks that the reward model's tokenizer has the same template)."""
        self.stats: dict[str, int] = {}
        """Counts from ``setup``: ``{split}_records``, ``{split}_examples``, ``{split}_dropped``
        for ``train``, ``val`` and a subclass's extra source (``reference``, ``ptx``)."""
        self._keep_hparams()

    def _keep_hparams(self) -> None:
        """Save the arguments of the data module's constructor as the hyperparameters (Lightning finds
        them up the stack, from a constructor that calls ``super().__init__()``), but for
        the tokenizer (an object), with ``chat_template`` canonical (``setup`` records how the strings
        were read: :func:`~rlhf_lit.data.rendering.recorded_choice`) and without its alias, and with two
        columns stored as older checkpoints hold them.

        ``fields`` is a dict (a dataclass instance would break weights_only loading) holding the
        columns added later (:data:`LATER_COLUMNS`: rankings, prompt / completion, messages) only
        when set to something other than their default (``val_split`` too, only when set), so the hparams of every other run are as
        before and a checkpoint written before they existed still resumes (the resume check compares
        them). ``hh_render`` is left out: ``setup`` stores ``always`` there when HH transcripts were
        rendered with the chat template (older checkpoints say ``chat_template``, its deprecated alias,
        removed in 0.3.0, which the resume check reads as ``always``), and nothing for raw strings, the only reading before
        the option existed, so a checkpoint written before it resumes exactly when its data is read
        as it was."""
        self.save_hyperparameters(ignore=["tokenizer", "fields", "apply_chat_template"])
        self.hparams["chat_template"] = self.chat_template
        defaults = Fields()
        self.hparams["fields"] = {
            name: value
            for name, value in dataclasses.asdict(self.fields).items()
            if name not in LATER_COLUMNS or value != getattr(defaults, name)
        }
        self.hparams.pop("hh_render", None)
        if self.val_split is None:  # added later: recorded only when set, as LATER_COLUMNS
            self.hparams.pop("val_split", None)

    def _record_format(self, option: str, format: str | None) -> None:
        """Keep the format a source was read in as the option ``option`` (``format``,
        ``reference_format``, ``ptx_format``) and in the hyperparameters, when it was ``auto``.

        The resume check compares the hyperparameters: a checkpoint records the format its data was
        read in, so an older checkpoint (``format: fields``, the default then) resumes under the
        default ``auto`` exactly when ``auto`` reads the data as ``fields``. ``format`` None: the
        option's source is not given; ``auto`` is then recorded as the older default."""
        if getattr(self, option) != AUTO:
            return
        format = format or LEGACY_FORMAT
        setattr(self, option, format)
        self.hparams[option] = format

    # ---------------------------------------------------------------------------------- setup
    def _examples(
        self, source: str, *, format: str, kind: Kind, max_records: int | None, split: str | None = None
    ) -> SourceExamples:
        """The ``kind`` examples of ``source`` read in ``format`` (at most ``max_records`` records; the hub
        ``split``, default the module's), that format (``auto`` resolved on the source) and each example's record,
        read by :func:`~rlhf_lit.data.reading.read_examples` with the module's settings; the train and validation
        sources pass the module's own format, a second source (reference or ptx set) its own."""
        assert self._hh is not None  # resolved before any source is read (read_splits)
        read = read_examples(
            source,
            format=format,
            kind=kind,
            fields=self.fields,
            split=split or self.split,
            subset=self.subset,
            max_records=max_records,
            skip_invalid=self.skip_invalid,
            prompt_words=self.prompt_words,
            extra_fields=tuple(getattr(self, "extra_fields", ())),
            hh_conversations=self._hh.chat,
        )
        if read.format == "hh_rlhf":
            self._note_hh(source, self._hh)
        return read

    def _note_hh(self, source: str, rendering: TemplateRendering) -> None:
        """Log how HH transcripts are rendered, once per setup (the first HH source names it); record
        a chat-template rendering in the hyperparameters (:meth:`_keep_hparams`)."""
        if self._hh_noted:
            return
        self._hh_noted = True
        log.info(hh_rendering_line(source, rendering))
        if rendering.chat:
            self.hparams["hh_render"] = "always"

    def setup(self, stage: str | None = None) -> None:
        """Read, adapt, split and tokenize both splits (once; later calls do nothing)."""
        if self.train_dataset is not None:
            return
        tokenizer = require_tokenizer(self.tokenizer, type(self).__name__)
        self.pad_token_id = require_pad_id(tokenizer)
        self._strings = resolve_template(self.chat_template, tokenizer, "chat_template", "the string prompts")
        self._rendered = []
        hh = resolve_template(self.hh_render, tokenizer, "hh_render", "HH-RLHF transcripts")
        train, val, format = self.read_splits(hh)
        encoder = self._encoder(self.train_path, format, [*train, *val])
        chat = encoder.apply_chat_template
        self.chat_rendered = chat or any(is_conversation(e.prompt) for e in (*train, *val))
        warning = raw_prompt_warning(tokenizer, format, [*train, *val], chat)
        if warning:
            log.warning("%s: %s", self.train_path, warning)
        train_items = self._encode_split(encoder, train, "train")
        val_items = self._encode_split(encoder, val, "val") if val else []
        self._setup_extra()
        self.hparams["chat_template"] = recorded_choice(self.chat_template, self._rendered)
        # assigned last: a failed setup (e.g. a missing extra source) is retried whole
        self.train_dataset, self.val_dataset = train_items, val_items
        self.sampler = ResumableSampler(
            len(train_items), shuffle=self.shuffle, seed=self.seed, order=self.shuffle_order, batch_size=self.batch_size
        )
        if self._pending_state is not None:
            self.sampler.load_state_dict(self._pending_state)
            self._pending_state = None

    def read_splits(self, hh: TemplateRendering) -> tuple[list[Example], list[Example], str]:
        """``(train, val, format)``: the training and validation examples as ``setup`` reads them, before any
        encoding, HH transcripts read as ``hh`` (``hh_render`` resolved for the tokenizer) says; and the format
        the training source was read in. The validation examples come from ``val_path`` / ``val_split``
        (:func:`~rlhf_lit.data.reading.validation_source`, read in that format), else the examples of
        ``val_fraction`` of the training records (seeded by ``seed``, drawn by record position:
        :func:`~rlhf_lit.data.splits.split_by_fraction`), else none. Prompt sources read a config's split through
        this."""
        self._hh, self._hh_noted = hh, False
        read = self._examples(self.train_path, format=self.format, kind=self.kind, max_records=self.max_records)
        train, format = read.examples, read.format
        self._record_format("format", format)
        val: list[Example] = []
        held_out = validation_source(self.train_path, self.val_path, self.val_split, self.split)
        if held_out is not None:  # read in the format of the training data
            source, split = held_out
            val = self._examples(
                source, format=format, kind=self.kind, max_records=self.max_records, split=split
            ).examples
        elif self.val_fraction > 0:
            # By the record's position in the source, the records the format leaves out counted: every data module
            # reading this source with this val_fraction and seed holds out the same records (the prompts of a
            # reward model's validation pairs are prompts PPO does not train on), whatever each format skips.
            train, val = split_by_fraction(
                train, self.val_fraction, self.seed, positions=read.positions, records=read.records
            )
        return train, val, format

    def _encoder(self, source: str, format: str, examples: list[Example]) -> TextEncoder:
        """The encoder of one source's ``examples``, read in ``format``: its strings rendered as ``chat_template``
        says (:func:`~rlhf_lit.data.rendering.renders_strings`), which one INFO line and :attr:`_rendered` note."""
        assert self._strings is not None  # resolved at the start of setup, which reads every source
        chat = renders_strings(self._strings, self.chat_template, format)
        if any(map(holds_strings, examples)):
            self._rendered.append(chat)
            log.info(string_rendering_line(source, format, chat, self._strings))
        return TextEncoder(self.tokenizer, apply_chat_template=chat)

    def _setup_extra(self) -> None:
        """Read and encode a subclass's extra source (reference set, ptx data); called once."""

    def _sft_source(self, name: str, max_length: int) -> list[dict[str, Any]] | None:
        """The SFT items of the second source ``name`` (``reference``, ``ptx``: the module's
        ``<name>_path``, read in ``<name>_format``, at most ``<name>_max_records`` records), built as
        SFT data builds them with ``max_prompt_length`` and ``max_length``; None without the source."""
        path = getattr(self, f"{name}_path")
        if path is None:
            return None
        format, max_records = getattr(self, f"{name}_format"), getattr(self, f"{name}_max_records")
        examples, format, _, _ = self._examples(path, format=format, kind="sft", max_records=max_records)
        self._record_format(f"{name}_format", format)
        return self._encode_split(
            self._encoder(path, format, examples),
            examples,
            name,
            partial(self._demonstrations, turns="all", max_length=max_length),
        )

    def _demonstrations(
        self, encoder: TextEncoder, examples: list[Example], turns: AssistantTurns, max_length: int
    ) -> list[dict[str, Any]]:
        """SFT items of ``examples`` (:func:`~rlhf_lit.data.demonstrations.encode_demonstrations`) with the
        module's ``max_prompt_length``, the cuts counted as this source's."""
        return encode_demonstrations(
            encoder,
            examples,
            turns=turns,
            max_prompt_length=self.max_prompt_length,
            max_length=max_length,
            counts=self.truncated,
        )

    def _encode_split(
        self,
        encoder: TextEncoder,
        examples: list[Example],
        name: str,
        encode: Callable[[TextEncoder, list[Example]], list[dict[str, Any]]] | None = None,
    ) -> list[dict[str, Any]]:
        """Encode with ``encode`` (default: the module's ``_encode``); record and log the counts."""
        self.truncated = Counter()  # filled by the truncation rule while encoding
        try:
            items = (encode or self._encode)(encoder, examples)
        except template_errors() as error:
            raise refused_conversation(encoder, examples, error) from None
        for part, count in sorted(self.truncated.items()):
            if not count:
                continue
            how = TRUNCATION_MESSAGES[part]
            log.info("%s: %d of %d %ss %s", name, count, len(examples), part, how)
            self.stats[f"{name}_truncated_{part}"] = count
        dropped = len(examples) - len(items)
        self.stats.update(
            {f"{name}_records": len(examples), f"{name}_examples": len(items), f"{name}_dropped": dropped}
        )
        if dropped:
            log.info(
                "%s: dropped %d of %d examples whose response keeps no token after truncation",
                name,
                dropped,
                len(examples),
            )
        if not items:
            raise ValueError(f"{name}: no examples left after tokenization and truncation")
        return items

    def _encode(self, encoder: TextEncoder, examples: list[Example]) -> list[dict[str, Any]]:
        raise NotImplementedError

    # ----------------------------------------------------------------------------- dataloaders
    def _require_setup(self) -> list[dict[str, Any]]:
        if self.train_dataset is None:
            raise RuntimeError(f"{type(self).__name__}.setup() has not been called")
        return self.train_dataset

    def _loader(
        self,
        dataset: list[dict[str, Any]],
        collate_fn: Any,
        batch_size: int | None = None,
        loader: type[DataLoader] = DataLoader,
        **kwargs: Any,
    ) -> DataLoader:
        """A DataLoader (of class ``loader``) with the module's workers; ``batch_size`` defaults to the module's."""
        return loader(
            dataset,  # type: ignore[arg-type]
            batch_size=batch_size or self.batch_size,
            collate_fn=collate_fn,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            **kwargs,
        )

    def _train_loader(self, collate_fn: Any, **kwargs: Any) -> DataLoader:
        """The training loader: :attr:`sampler`'s order, its position kept by this module."""
        dataset = self._require_setup()
        return self._loader(dataset, collate_fn, loader=PositionedLoader, sampler=self.sampler, **kwargs)

    def _shuffled_train_loader(self, collate_fn: Any) -> DataLoader:
        """The training loader of SFT, RM and DPO: all examples (the last batch of an epoch may be smaller)."""
        # The generator only seeds the iterator (worker seeds): the global RNG stays untouched.
        return self._train_loader(collate_fn, generator=torch.Generator().manual_seed(self.seed))

    def _val_loader(self, collate_fn: Any) -> DataLoader | list:
        """The validation loader, or ``[]`` (no validation) when there is no validation data."""
        self._require_setup()
        return self._loader(self.val_dataset, collate_fn) if self.val_dataset else []

    # ------------------------------------------------------------------------------ resuming
    def mark_consumed(self, n: int) -> None:
        """Report that training took ``n`` more training examples (of all processes together);
        this is what a resumed run skips."""
        self._require_setup()  # the sampler is built with the training data
        self.sampler.mark_consumed(n)  # type: ignore[union-attr]

    def state_dict(self) -> dict[str, Any]:
        """The data position (epoch and examples consumed), saved into Lightning checkpoints."""
        if self.sampler is not None:
            return {"sampler": self.sampler.state_dict()}
        return {"sampler": self._pending_state} if self._pending_state is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from a checkpoint's data position (applied in ``setup`` when called before it)."""
        state = state_dict.get("sampler")
        if state is None:
            # A checkpoint from before the position was saved: the epoch restarts from its first batch
            # (Lightning's own counter is restored, so a mid-epoch resume repeats some examples).
            log.warning(
                "the checkpoint holds no data position (written by an older rlhf-lit): a resume in the "
                "middle of an epoch starts that epoch's data from its first batch"
            )
            return
        if self.sampler is not None:
            self.sampler.load_state_dict(state)
        else:
            self._pending_state = dict(state)

"""Prompt sources: where the prompts of ``rlhf-lit evaluate``, ``rlhf-lit best-of-n``, ``rlhf-lit iterate``, the
``OnlineGeneration`` callback and the guard's held-out set come from, read as ``rlhf-lit fit``'s data modules
read theirs (:mod:`rlhf_lit.data.reading`: the same reader, formats and checks).

A :class:`PromptSource` names one of

- ``path``: a local file or a Hugging Face hub dataset (its ``split``, default ``train``, and ``subset``).
  Records (``.jsonl``, ``.json``, optionally ``.gz``; a hub dataset's rows) in any format of the adapter
  registry that gives prompts, ``auto`` detecting it from the first record as the data modules do: HH-RLHF
  transcripts cut at the last human turn, ``messages`` without their last assistant turn, ``prompt`` strings
  or conversations, ... (:mod:`rlhf_lit.data.adapters`). A plain-text file (``.txt``, ``.txt.gz``) holds one
  prompt per non-blank line, kept as written (format ``lines``; ``paragraphs`` reads it as the data modules
  do); ``jsonl`` reads a file of another name as JSON lines. ``field`` names the column holding the prompt
  (read as format ``fields`` under ``auto``; ``messages`` takes its conversation from it too).
- ``config``: a ``rlhf-lit fit`` config. Its data module (``data.class_path`` with ``data.init_args``) is built
  and reads its sources itself (:meth:`~rlhf_lit.data.base.TextDataModule.read_splits`); the prompts are those
  of its ``val`` split (the default: what it holds out, by ``val_path``, ``val_split`` or the seeded
  ``val_fraction``) or of its ``train`` split. An unset ``seed`` of the data module follows the run seed as in
  ``fit``: ``seed`` here (what ``--seed_everything`` the fit was given), else the config's ``seed_everything``.

HH-RLHF transcripts read as conversations or as strings by the tokenizer that reads them, as in the data
modules: a path source by the caller's ``chat_template`` (``auto``: conversations when the tokenizer has a chat
template), a config source by its data module's ``hh_render``. :func:`read_prompt_source` takes that tokenizer
(None: strings, but for ``always``). ``skip`` and ``max_prompts`` cut the prompts read. Every error is one
``ValueError`` naming the file or dataset (its split), the record and the field.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal, get_args

from rlhf_lit.data.adapters import AUTO, Example, Fields, formats_for
from rlhf_lit.data.conversation import TextOrConversation
from rlhf_lit.data.reading import read_examples
from rlhf_lit.data.record_parts import get_prompt
from rlhf_lit.data.records import Row, is_text_file
from rlhf_lit.data.rendering import TemplateOption, TemplateRendering, resolve_template, said, template_choice
from rlhf_lit.option_values import check_choice, check_least
from rlhf_lit.run_seed import CLI_DEFAULT_SEED, UNSEEDED_DEFAULT

if TYPE_CHECKING:  # imported when called: the data modules import Lightning, which a path source never needs
    from rlhf_lit.data.base import TextDataModule

FILE_READINGS = ("lines", "jsonl")
"""The formats of a prompt source that say how a file is read (:data:`rlhf_lit.data.records.FileReading`)."""
PromptSourceFormat = Literal[(*formats_for("prompt"), *FILE_READINGS)]  # type: ignore[valid-type]
"""``auto``, the record formats that give prompts (the registry's, as ``PromptDataModule.format``), ``lines``
and ``jsonl``."""
CONFIG_SPLITS = ("val", "train")
"""The splits of a ``fit`` config's data module: what it holds out, what it trains on."""
LINE = "text"
"""The column a line of a ``lines`` file is read into (:mod:`rlhf_lit.data.records`)."""


@dataclass(frozen=True)
class PromptSource:
    """Where prompts come from (the module docstring): a ``path`` (file or hub dataset) or a ``fit`` ``config``.

    Args:
        path: a local file (``.jsonl``, ``.json``, ``.txt``, optionally ``.gz``) or a hub dataset name.
        config: a ``rlhf-lit fit`` config file whose data module's prompts to take.
        split: a hub dataset's split (default ``train``); of a config, ``val`` (default) or ``train``.
        subset: a hub dataset's configuration (subset).
        format: ``auto``, a record format that gives prompts, ``lines`` or ``jsonl`` (path only).
        field: the column holding the prompt (path only).
        seed: the run seed of the fit a config's split is taken from (``--seed_everything``); default the
            config's ``seed_everything``. A data module that sets its own ``seed`` keeps it, as in ``fit``.
        skip: leave out the first N prompts.
        max_prompts: keep at most N prompts (after ``skip``).
    """

    path: str | None = None
    config: str | None = None
    split: str | None = None
    subset: str | None = None
    format: PromptSourceFormat = "auto"
    field: str | None = None
    seed: int | None = None
    skip: int = 0
    max_prompts: int | None = None

    def __post_init__(self) -> None:
        """Refuse settings no source can use (``ValueError`` naming them)."""
        if (self.path is None) == (self.config is None):
            raise ValueError("a prompt source takes a path (a file or a hub dataset) or a config (a fit config)")
        check_choice("format", self.format, get_args(PromptSourceFormat))
        check_least("skip", self.skip, 0)
        if self.max_prompts is not None:
            check_least("max_prompts", self.max_prompts, 1)
        if self.config is None:
            if self.seed is not None:
                raise ValueError("seed is the run seed of a fit config's split; a path has none")
            return
        given = [name for name in ("subset", "field") if getattr(self, name) is not None]
        given += ["format"] if self.format != AUTO else []
        if given:
            raise ValueError(f"{', '.join(given)} with config {self.config}: its data module says how its records read")
        if self.split is not None:
            check_choice(f"split of config {self.config}", self.split, CONFIG_SPLITS)

    @property
    def name(self) -> str:
        """The source as messages and logs name it."""
        if self.config is not None:
            return f"{self.config} ({self.split or 'val'} split)"
        return self.path if self.split is None else f"{self.path} (split {self.split!r})"  # type: ignore[return-value]


@dataclass(frozen=True)
class PromptSet:
    """Prompts read for one tokenizer: ``prompts`` (strings or conversations), the record ``format`` they were
    read in (what a ``chat_template: auto`` keeps as strings follows it:
    :func:`rlhf_lit.data.prompt_rendering.prompt_rendering`; None: given as a list) and ``where`` they came from."""

    prompts: list[TextOrConversation]
    format: str | None = None
    where: str = "prompts"


Prompts = Sequence[TextOrConversation] | PromptSource | PromptSet | str | Mapping[str, Any]
"""What takes prompts: a list (strings or conversations), a source (a path string is ``PromptSource(path=...)``,
a mapping its keys), or a set already read."""


def as_source(value: PromptSource | str | Mapping[str, Any]) -> PromptSource:
    """``value`` as a :class:`PromptSource`: a string is a path, a mapping its keys (a config's ``{path: ...,
    split: ...}``); an unknown key is one ``ValueError`` listing those a source takes."""
    if isinstance(value, str):
        return PromptSource(path=value)
    if isinstance(value, Mapping):
        keys = [f.name for f in fields(PromptSource)]
        unknown = sorted(set(value) - set(keys))
        if unknown:
            raise ValueError(f"unknown prompt source key(s) {', '.join(unknown)}; a source takes {', '.join(keys)}")
        return PromptSource(**value)
    return value


def given_prompts(values: Sequence[Any], where: str, field: str = "prompts") -> list[TextOrConversation]:
    """Prompts given as a list (``where``'s ``field``), each checked as the data modules check a record's prompt:
    a non-empty string, or messages (dicts, a list or tuple of them) ending on the user's turn, made a conversation."""
    if not values:
        raise ValueError(f"{where}: {field} is empty; give at least one prompt")
    prompts = []
    for i, value in enumerate(values):
        key = f"{field}[{i}]"
        prompts.append(get_prompt(Row(where, {key: list(value) if isinstance(value, tuple) else value}), key))
    return prompts


def hh_reading(option: TemplateOption, tokenizer: Any, name: str, training: bool | None = None) -> TemplateRendering:
    """How HH transcripts read for ``tokenizer``: the option ``name`` resolved for it
    (:func:`~rlhf_lit.data.rendering.resolve_template`); ``always`` as conversations, whether the tokenizer can
    render them or not (rendering them is where that is refused, naming the option that asked); without a
    tokenizer as strings, unless ``always``."""
    if tokenizer is None or template_choice(option, name) == "always":
        return TemplateRendering(template_choice(option, name) == "always", said(name, option))
    return resolve_template(option, tokenizer, name, "HH-RLHF transcripts", training)


def read_prompt_source(
    source: PromptSource | str | Mapping[str, Any],
    tokenizer: Any = None,
    chat_template: TemplateOption = "auto",
    *,
    training: bool | None = None,
) -> PromptSet:
    """The prompts of ``source`` for ``tokenizer`` (the module docstring), cut by its ``skip`` and ``max_prompts``.

    ``chat_template``: the reading model's option (``auto``, ``always``, ``never``; ``training`` as
    :func:`~rlhf_lit.data.rendering.resolve_template` takes it), which decides how a path's HH transcripts read.
    """
    source = as_source(source)
    examples, format = read_prompt_examples(source, tokenizer, chat_template, training=training)
    return PromptSet([example.prompt for example in examples], format, source.name)


def read_prompt_examples(
    source: PromptSource | str | Mapping[str, Any],
    tokenizer: Any = None,
    chat_template: TemplateOption = "auto",
    *,
    training: bool | None = None,
) -> tuple[list[Example], str]:
    """The examples :func:`read_prompt_source` takes its prompts from (cut by ``skip`` and ``max_prompts``, each
    naming its record in ``where``) and the format they were read in."""
    source = as_source(source)
    if source.config is not None:
        examples, format = _config_examples(source, tokenizer)
    else:
        examples, format = _path_examples(source, hh_reading(chat_template, tokenizer, "chat_template", training))
    kept = examples[source.skip :][: source.max_prompts]
    if not kept:
        raise ValueError(f"{source.name}: no prompts left after skip {source.skip} (it holds {len(examples)})")
    return kept, format


def as_prompt_set(
    prompts: Prompts, tokenizer: Any, chat_template: TemplateOption, where: str, training: bool | None = None
) -> PromptSet:
    """``prompts`` read for ``tokenizer``: a set as it is, a source by :func:`read_prompt_source`, a list checked
    (:func:`given_prompts`, ``where`` naming it)."""
    if isinstance(prompts, PromptSet):
        return prompts
    if isinstance(prompts, (str, PromptSource, Mapping)):
        return read_prompt_source(as_source(prompts), tokenizer, chat_template, training=training)
    return PromptSet(given_prompts(prompts, where), None, where)


def _path_examples(source: PromptSource, hh: TemplateRendering) -> tuple[list[Example], str]:
    """The prompt examples of a file or hub dataset, by the reader of the data modules."""
    from rlhf_lit.data.prompts import PromptDataModule

    path, format = str(source.path), source.format
    fields = Fields() if source.field is None else Fields(prompt=source.field, messages=source.field)
    reading = "by_name"
    if format == "lines" or (format == AUTO and is_text_file(path)):
        reading, format, fields = "lines", "fields", Fields(prompt=LINE)
    elif format == "jsonl":
        reading, format = "jsonl", AUTO
    if format == AUTO and source.field is not None:
        format = "fields"  # the named column holds the prompt, whatever other columns the records have
    words = inspect.signature(PromptDataModule).parameters["prompt_words"].default  # paragraphs: as PPO's data
    examples, format, _, _ = read_examples(
        path,
        format=format,
        kind="prompt",
        fields=fields,
        split=source.split or "train",
        subset=source.subset,
        prompt_words=words,
        hh_conversations=hh.chat,
        file_reading=reading,
    )
    return examples, format


def _config_examples(source: PromptSource, tokenizer: Any) -> tuple[list[Example], str]:
    """The examples of a fit config's data module's split, read by the data module itself."""
    config = str(source.config)
    module = config_data_module(config, source.seed)
    train, val, format = module.read_splits(hh_reading(module.hh_render, tokenizer, "hh_render"))
    split = source.split or "val"
    examples = val if split == "val" else train
    if not examples:
        raise ValueError(
            f"{config}: its data module holds out no prompts (it sets no val_path, val_split or val_fraction); "
            "take its train split, or hold some out"
        )
    return examples, format


def config_data_module(config: str, seed: int | None = None) -> TextDataModule:
    """The data module the fit config ``config`` builds (``data.class_path`` with its ``data.init_args``), without
    a tokenizer: enough to read its splits (:meth:`~rlhf_lit.data.base.TextDataModule.read_splits`), not to set it
    up. An unset ``seed`` of the module follows the run seed as in ``fit``: ``seed`` (what ``--seed_everything``
    the fit was given), else the config's ``seed_everything``. A config without a data module of
    :mod:`rlhf_lit.data`, or with options it refuses, is one ``ValueError`` naming the file."""
    from rlhf_lit.callable_specs import import_class
    from rlhf_lit.config_files import read_yaml_mapping
    from rlhf_lit.data.base import TextDataModule

    values = read_yaml_mapping(config)
    data = values.get("data")
    class_path = data.get("class_path") if isinstance(data, dict) else None
    if not isinstance(class_path, str):
        raise ValueError(f"{config}: no data module (data.class_path) to read prompts from")
    module_class = import_class(class_path) or import_class(f"rlhf_lit.data.{class_path}")
    if module_class is None or not issubclass(module_class, TextDataModule):
        raise ValueError(f"{config}: data.class_path {class_path!r} is not a data module of rlhf_lit.data")
    init_args = dict(data.get("init_args") or {})  # type: ignore[union-attr]
    init_args.pop("tokenizer", None)
    if init_args.get("seed") is None:  # as fit resolves it (rlhf_lit.run_seed), from this run's seed
        init_args["seed"] = seed if seed is not None else _run_seed(values, config)
    try:
        return module_class(**init_args)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{config}: data.init_args: {error}") from None


def _run_seed(values: dict, config: str) -> int:
    """The run seed ``rlhf-lit fit --config <config>`` runs with: its ``seed_everything`` (the CLI's default when
    unset; ``false``: unseeded)."""
    seed = values.get("seed_everything", CLI_DEFAULT_SEED)
    if seed is False:
        return UNSEEDED_DEFAULT
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(
            f"{config}: seed_everything {seed!r} draws the run seed when the fit starts, and the split follows it; "
            "give the seed the run used (its config.yaml in the run's log folder records it)"
        )
    return seed

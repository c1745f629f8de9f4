"""Preference data: (prompt, chosen, rejected[, margin]) -> right padded chosen and rejected
sequences, or (prompt, K ranked responses) -> ranking batches, for the reward model; and an
optional reference set of demonstrations on which the trained reward is normalised."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader

from rlhf_lit.data.adapters import Example, Fields, PreferenceFormat, SFTFormat, check_extra_fields
from rlhf_lit.data.base import TextDataModule, check_lengths, check_sft_source
from rlhf_lit.data.collate import PreferenceCollator, RankingCollator, SequenceCollator
from rlhf_lit.data.encoding import TextEncoder, truncate_prompt, truncate_response
from rlhf_lit.data.rendering import TemplateOption, TemplateRendering

log = logging.getLogger("rlhf_lit.data")


class PreferenceDataModule(TextDataModule):
    """Pairwise preferences or K-way rankings for reward-model training.

    Pair batches (right padded, chosen and rejected to one common T): ``chosen_input_ids``,
    ``chosen_attention_mask``, ``rejected_input_ids``, ``rejected_attention_mask`` ``(B, T)``,
    ``prompt_length (B,)`` long, the number of (truncated) prompt tokens both sequences start
    with (DPO scores the tokens after it), and ``margin (B,)`` float when ``fields.margin`` is set.

    Ranking batches (``format: rankings``; :class:`~rlhf_lit.data.collate.RankingCollator`): every
    response of the batch's B prompts as one right padded ``input_ids`` / ``attention_mask``
    ``(N, T)``, rows position-major, with ``group``, ``rank``, ``prompt_length`` ``(N,)`` and
    ``responses_per_prompt (B,)`` (docs/CONTRACTS.md).

    Each sequence is prompt + response + EOS with the SFT truncation rule: the shared prompt is
    truncated from the LEFT to ``max_prompt_length``, each response from the right so that the
    sequence has at most ``max_length`` tokens; a cut response gets no EOS. A pair where either
    response keeps no token is dropped, counted and logged once. In a ranking, a response that
    keeps no token is dropped (counted) and the others keep their order (ranks renumbered 0, 1,
    ...); a ranking left with fewer than 2 distinct ranks is dropped, counted and logged once.

    Reward normalisation reference set (InstructGPT shifts the trained reward so that
    demonstrations score 0 on average): with ``reference_path``, ``reference_dataloader()`` gives
    right padded ``input_ids`` / ``attention_mask`` ``(B, T)`` batches of prompt + response (+ EOS)
    built exactly as SFT data (same truncation rule, with this module's ``max_length`` and
    ``max_prompt_length``), in file order, unshuffled and unsharded (every process scores the
    whole set; RewardModelModule sums the moments over processes, which gives the same mean). Without
    ``reference_path`` the module has no ``reference_dataloader`` attribute at all, so RewardModelModule
    falls back to the validation pairs (chosen and rejected pooled).

    Args:
        tokenizer: Hugging Face tokenizer; set by the CLI from the model stage (must have a pad
            token). Required by ``setup``.
        train_path: training data: a local file (.jsonl, .json, optionally .gz) if it exists,
            else a Hugging Face hub dataset name (needs ``pip install 'rlhf-lit[hub]'``). A
            path-like string that does not exist is an error, never a hub lookup.
        val_path: validation data from a separate source (same rules as ``train_path``).
        val_fraction: else hold out this fraction of the training pairs (seeded by ``seed``);
            0 means no validation. Giving it together with ``val_path`` is an error.
        val_split: the hub split of the validation data, e.g. ``test`` (HH-RLHF) or ``test_prefs``
            (UltraFeedback): of ``val_path``, or without ``val_path`` of ``train_path``'s dataset. None:
            ``val_path`` is read with ``split``. A local file has no splits, and a split is not held out
            beside ``val_fraction``: both are errors naming the option.
        seed: seed of the validation split and of the training shuffle; None: the run's
            ``seed_everything`` (:mod:`rlhf_lit.run_seed`), so another run seed holds out other
            examples and shuffles them in another order.
        format: record format: ``auto`` (detected from the first record, :mod:`rlhf_lit.data.detect`)
            or one of the registry :data:`rlhf_lit.data.adapters.ADAPTERS` that gives preference
            examples (what each reads: :mod:`rlhf_lit.data.adapters`; ``hh_rlhf`` pairs that do not
            share the prompt are skipped and counted; ``rankings`` carry no margin). ``val_path`` is
            read in the format of ``train_path``; after ``setup`` this attribute holds the format
            ``auto`` picked.
        fields: column names of the records.
        split: hub split to read.
        subset: hub dataset configuration (subset) name.
        max_records: read at most this many records per source (None: all).
        skip_invalid: skip (and count, log once) lines that do not parse and records with a
            missing, non-string or empty field, instead of raising.
        chat_template: whether string prompts are rendered as a user turn and string responses as
            the assistant turn with the tokenizer's chat template, as ``SFTDataModule``'s (every source,
            ``reference_path`` too).
        hh_render: how ``hh_rlhf`` transcripts are rendered
            (:data:`rlhf_lit.data.rendering.TemplateChoice`: ``auto``, with the chat template when the
            tokenizer has one; ``always``; ``never``, kept as strings; ``chat_template`` and ``raw`` are
            deprecated aliases of ``always`` and ``never``, removed in 0.3.0), for every source read as
            ``hh_rlhf`` (``reference_path`` too). One INFO line says which was used and why.
        max_length: the most tokens of prompt + response + EOS, per sequence.
        max_prompt_length: the most prompt tokens (must be below ``max_length``).
        batch_size: pairs (or rankings) per batch (and reference sequences per reference batch).
        num_workers: DataLoader worker processes.
        reference_path: demonstrations (prompt + response, e.g. the SFT training data) on which
            the trained reward is normalised; same source rules as ``train_path``. None: the
            reward model normalises on the validation pairs.
        reference_format: record format of ``reference_path``, read as SFT examples (prompt +
            response: a ``paragraphs`` record is its whole paragraph, cut to ``max_length``): ``auto``
            (detected from its first record as ``SFTDataModule`` detects it) or one of the registry
            :data:`rlhf_lit.data.adapters.ADAPTERS` that gives SFT examples (:mod:`rlhf_lit.data.adapters`).
        reference_max_records: read at most this many reference records (None: all).
        extra_fields: columns of the pair records passed through unchanged to the batch as
            ``batch["extras"][name]`` (a list per column, one value per pair; never tensors), as
            ``PromptDataModule``'s, and kept with each record's location for a stage to check before
            training (:meth:`extra_values`; BoNBoN's ``n``). Every record must have them; pairs only.
        apply_chat_template: deprecated alias of ``chat_template``, removed in 0.3.0: ``true`` is
            ``always``, ``false`` ``never`` (a warning says so; given with ``chat_template`` an error).
    """

    kind = "preference"

    def __init__(
        self,
        *,
        tokenizer: Any = None,
        train_path: str,
        val_path: str | None = None,
        val_fraction: float = 0.0,
        val_split: str | None = None,
        seed: int | None = None,
        format: PreferenceFormat = "auto",
        fields: Fields = Fields(),
        split: str = "train",
        subset: str | None = None,
        max_records: int | None = None,
        skip_invalid: bool = False,
        chat_template: TemplateOption = "auto",
        hh_render: TemplateOption = "auto",
        max_length: int = 512,
        max_prompt_length: int = 256,
        batch_size: int = 8,
        num_workers: int = 0,
        reference_path: str | None = None,
        reference_format: SFTFormat = "auto",
        reference_max_records: int | None = None,
        extra_fields: list[str] | None = None,
        apply_chat_template: bool | None = None,
    ):
        super().__init__()
        check_lengths(max_prompt_length, max_length)
        self._init_common(locals())
        self.extra_fields = check_extra_fields(extra_fields)
        if self.extra_fields and self.format == "rankings":
            raise ValueError(f"extra_fields ({self.extra_fields}) are read for pairs only, not for format 'rankings'")
        if not self.extra_fields:  # added later: recorded only when set, so older checkpoints resume
            self.hparams.pop("extra_fields", None)
        self._extra_rows: list[tuple[str, dict[str, Any]]] = []
        check_sft_source("reference", reference_path, reference_format, max_records=reference_max_records)
        self.reference_dataset: list[dict[str, Any]] | None = None
        if reference_path is None:
            self._record_format("reference_format", None)

    def _encode(self, encoder: TextEncoder, examples: list[Example]) -> list[dict[str, Any]]:
        if self.format == "rankings":
            return self._encode_rankings(encoder, examples)
        prompts = [e.prompt for e in examples]
        prompt_ids, chosen_ids, chosen_ends = encoder.encode_pairs(prompts, [e.chosen or "" for e in examples])
        _, rejected_ids, rejected_ends = encoder.encode_pairs(prompts, [e.rejected or "" for e in examples])
        items = []
        chosen_cut, rejected_cut = Counter(), Counter()  # counted apart: each is one of len(examples)
        for e, p, c, r, c_end, r_end in zip(examples, prompt_ids, chosen_ids, rejected_ids, chosen_ends, rejected_ends):
            p = truncate_prompt(p, encoder.prefix, self.max_prompt_length, self.truncated)
            c = truncate_response(p, c, c_end, self.max_length, chosen_cut)
            r = truncate_response(p, r, r_end, self.max_length, rejected_cut)
            if c is None or r is None:
                continue
            item: dict[str, Any] = {"chosen_input_ids": p + c, "rejected_input_ids": p + r, "prompt_length": len(p)}
            if e.margin is not None:
                item["margin"] = e.margin
            if self.extra_fields:
                item["extras"] = e.extras
            items.append(item)
        self.truncated.update(
            {"chosen response": chosen_cut["response"], "rejected response": rejected_cut["response"]}
        )
        return items

    def read_splits(self, hh: TemplateRendering) -> tuple[list[Example], list[Example], str]:
        """The base class's reading, keeping each example's extra columns with its location (:meth:`extra_values`)."""
        train, val, format = super().read_splits(hh)
        self._extra_rows = [(e.where, e.extras) for e in (*train, *val)] if self.extra_fields else []
        return train, val, format

    def extra_values(self, name: str) -> list[tuple[str, Any]]:
        """``(where, value)`` of the extra column ``name`` (one of ``extra_fields``) in every training and
        validation record, ``where`` naming its file and line; after ``setup``. A stage checks its records
        against its settings with it before training (stages never import this package)."""
        if name not in self.extra_fields:
            raise ValueError(f"{name!r} is not among extra_fields {self.extra_fields}: the records' {name} is not read")
        return [(where, extras[name]) for where, extras in self._extra_rows]

    def _encode_rankings(self, encoder: TextEncoder, examples: list[Example]) -> list[dict[str, Any]]:
        """Ranking items ``{"input_ids": [one list per response], "rank", "prompt_length"}``: each
        response by the pair rule; responses that keep no token dropped (counted in
        ``self.ranked``), the rest renumbered densely; a ranking left without 2 ranks dropped."""
        # One (prompt, response) per response, tokenized exactly as a pair's chosen or rejected is.
        flat_prompts = [e.prompt for e in examples for _ in e.responses or ()]
        flat_responses = [r for e in examples for r in e.responses or ()]
        flat_prompt_ids, flat_response_ids, flat_ends = encoder.encode_pairs(flat_prompts, flat_responses)
        items, start = [], 0
        for e in examples:
            K = len(e.responses or ())
            p = truncate_prompt(flat_prompt_ids[start], encoder.prefix, self.max_prompt_length, self.truncated)
            kept: list[tuple[list[int], int]] = []
            for r, end, rank in zip(flat_response_ids[start : start + K], flat_ends[start : start + K], e.ranks or ()):
                ids = truncate_response(p, r, end, self.max_length, self.ranked)
                if ids is not None:
                    kept.append((p + ids, rank))
            start += K
            self.ranked["responses"] += K
            self.ranked["dropped"] += K - len(kept)
            distinct = sorted({rank for _, rank in kept})
            if len(distinct) < 2:
                continue
            dense = {rank: i for i, rank in enumerate(distinct)}
            items.append(
                {
                    "input_ids": [ids for ids, _ in kept],
                    "rank": [dense[rank] for _, rank in kept],
                    "prompt_length": len(p),
                }
            )
        return items

    def _encode_split(
        self, encoder: TextEncoder, examples: list[Example], name: str, encode: Any = None
    ) -> list[dict[str, Any]]:
        """The base class's encoding and counts, plus the ranked responses cut and dropped."""
        self.ranked: Counter[str] = Counter()  # responses, response (cut), dropped: filled by _encode_rankings
        items = super()._encode_split(encoder, examples, name, encode)
        total, cut, dropped = self.ranked["responses"], self.ranked["response"], self.ranked["dropped"]
        if cut:
            log.info(
                "%s: %d of %d ranked responses did not fit in max_length: cut at the end, without EOS", name, cut, total
            )
            self.stats[f"{name}_truncated_ranked_response"] = cut
        if dropped:
            log.info(
                "%s: dropped %d of %d ranked responses that keep no token after truncation "
                "(a ranking left with fewer than 2 ranks is dropped whole)",
                name,
                dropped,
                total,
            )
            self.stats[f"{name}_dropped_responses"] = dropped
        return items

    def _collator(self) -> PreferenceCollator | RankingCollator:
        """The batch format of ``format``: ranking batches for rankings, pair batches otherwise."""
        if self.format == "rankings":
            return RankingCollator(self.pad_token_id)
        return PreferenceCollator(self.pad_token_id)

    def train_dataloader(self) -> DataLoader:
        return self._shuffled_train_loader(self._collator())

    def val_dataloader(self) -> DataLoader | list:
        return self._val_loader(self._collator())

    # ------------------------------------------------------------------------ reference set
    def _setup_extra(self) -> None:
        self.reference_dataset = self._sft_source("reference", self.max_length)

    @property
    def reference_dataloader(self) -> Callable[[], DataLoader]:
        """``reference_dataloader()``: the reference set's ``input_ids`` / ``attention_mask``
        batches (see the class docstring). Exists only when ``reference_path`` is set; otherwise
        reading it raises ``AttributeError``, so ``hasattr(dm, "reference_dataloader")`` is False
        and a consumer (RewardModelModule) uses its fallback."""
        if self.reference_path is None:
            raise AttributeError(
                "PreferenceDataModule has no reference_dataloader: reference_path is not set "
                "(RewardModelModule then normalises on the validation pairs)"
            )
        return self._reference_dataloader

    def _reference_dataloader(self) -> DataLoader:
        self._require_setup()
        assert self.reference_dataset is not None  # set by setup() since reference_path is set
        return self._loader(self.reference_dataset, SequenceCollator(self.pad_token_id))

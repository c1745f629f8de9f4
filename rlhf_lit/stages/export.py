"""Writing a stage's final model and tokenizer in Hugging Face format, atomically, on rank 0.

Lightning checkpoints stay the way to resume; the export is what the next stage (or any
``from_pretrained`` user) loads.

rlhf-lit never deletes or overwrites what it did not write (the rule of :mod:`rlhf_lit.artifacts`):
every export carries a marker file (:data:`MARKER`), a non-empty directory without it is never
replaced, and an earlier export is replaced only when the stage's ``export_existing`` says
``replace`` (by an atomic swap with the complete new one). The target is checked when fit starts, so a refusal costs no training.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rlhf_lit.artifacts import EXPORT_MARKER, TargetChanged, directory_state, write_directory_atomically
from rlhf_lit.integrity import DamagedFile, check_json_file
from rlhf_lit.models.lora import export_parts
from rlhf_lit.models.sharding import full_state_dict
from rlhf_lit.stages.nonfinite import assert_finite

log = logging.getLogger(__name__)

MARKER = EXPORT_MARKER
"""``rlhf_lit_export.json`` (:data:`rlhf_lit.artifacts.EXPORT_MARKER`), written into every export: what it is
and when it was written. Only such a directory is ever replaced."""
SAMPLING_KEY = "sampling"
"""The marker's entry for how a policy sampled in training (``max_new_tokens``, ``temperature``, ``top_k``,
``top_p``), which ``rlhf-lit evaluate`` and ``best-of-n`` sample with unless told otherwise."""

ExportExisting = Literal["refuse", "replace"]
"""What to do when ``export_dir`` already holds an earlier rlhf-lit export: ``refuse`` (stop before
training, naming it) or ``replace`` it atomically at the end of fit. A non-empty directory that
rlhf-lit did not write is refused either way."""


def default_export_dir(trainer: pl.Trainer) -> str:
    """``<trainer.log_dir or default_root_dir>/model``: next to the run's logs and checkpoints."""
    return os.path.join(trainer.log_dir or trainer.default_root_dir, "model")


def check_export_target(path: str | os.PathLike, existing: ExportExisting) -> None:
    """Raise ValueError unless an export may be written to ``path`` (see the module docstring)."""
    target = Path(path)
    state = directory_state(target, MARKER)
    if state in ("absent", "empty"):
        return
    if state == "not_a_directory":
        raise ValueError(f"export_dir {target} exists and is not a directory; choose another export_dir")
    marker = target / MARKER
    if state == "foreign":
        raise ValueError(
            f"export_dir {target} is not empty and was not written by rlhf-lit (no {MARKER}); it is never "
            "replaced: choose another export_dir"
        )
    if existing != "replace":
        try:
            about = check_json_file(marker)
            what = f" ({about.get('what', 'an export')}, written {about.get('written', '?')})"
        except DamagedFile as damaged:  # a crash or a cut-short copy: say so, not an empty description
            what = f" (its marker is damaged: {damaged})"
        except OSError as error:
            what = f" (its marker cannot be read: {error})"
        raise ValueError(
            f"export_dir {target} holds an earlier rlhf-lit export{what}; set export_existing: replace "
            "(--model.init_args.export_existing replace) to replace it, or choose another export_dir"
        )


def save_pretrained_atomically(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    path: str | os.PathLike,
    what: str = "model",
    existing: ExportExisting = "refuse",
    state_dict: dict[str, torch.Tensor] | None = None,
    facts: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``model`` and ``tokenizer`` with ``save_pretrained`` so that ``path`` is never half written.

    ``state_dict``: the weights to write instead of ``model``'s own (the gathered weights of a
    sharded model, :func:`~rlhf_lit.models.sharding.full_state_dict`). ``facts``: more entries of the
    :data:`MARKER` beside ``what`` and ``written`` (a PPO policy's ``sampling``: :data:`SAMPLING_KEY`).

    The target is checked again here with :func:`check_export_target`; the write is
    :func:`rlhf_lit.artifacts.write_directory_atomically` (a new hidden directory beside ``path``
    with the :data:`MARKER` in it, renamed into place; an earlier export is deleted only after the
    new one is in place), so a crash leaves either the old or the new export, never a mixture.

    Returns:
        The absolute path of the export.
    """
    final = Path(path).absolute()
    check_export_target(final, existing)
    assert_finite(model if state_dict is None else state_dict, what)

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp, **({} if state_dict is None else {"state_dict": state_dict}))
        tokenizer.save_pretrained(tmp)

    def about() -> str:  # read when the contents are written: the time of writing
        written = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        return json.dumps({"what": what, "written": written, **(facts or {})}) + "\n"

    try:
        return write_directory_atomically(final, fill, MARKER, about)
    except TargetChanged:
        raise ValueError(f"export_dir {final} changed while the export was written; it was left as it is") from None


def export_at_fit_end(
    trainer: pl.Trainer,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    export_dir: str | None,
    what: str,
    existing: ExportExisting = "refuse",
    facts: Mapping[str, Any] | None = None,
) -> Path | None:
    """Export on global rank 0 only, print and log where; other ranks return None.

    Every rank must call this: resolving the default path (``trainer.log_dir``) is a collective
    broadcast under DDP, gathering a sharded model's weights onto rank 0 is one under FSDP, and a
    barrier after the write lets no rank run ahead of the files.

    Args:
        trainer: The trainer that just finished fitting (its log dir gives the default place).
        model: The trained Hugging Face model (on CPU after fit; Lightning moves it there); a LoRA
            model is written merged or as its adapter (:func:`~rlhf_lit.models.lora.export_parts`).
        tokenizer: The run's tokenizer, written next to the model.
        export_dir: Where to write; None means :func:`default_export_dir`.
        what: Words for the message, e.g. ``"SFT model"``.
        existing: What to do with an earlier export at the target (:data:`ExportExisting`).
        facts: More entries of the export's marker (:func:`save_pretrained_atomically`).
    """
    target = export_dir or default_export_dir(trainer)  # collective: on every rank
    weights = full_state_dict(model)  # collective when sharded (FSDP): the whole model on rank 0
    path = None
    if trainer.is_global_zero:
        written, weights = export_parts(model, weights)
        path = save_pretrained_atomically(written, tokenizer, target, what, existing, state_dict=weights, facts=facts)
        print(f"[rlhf-lit] exported {what} to {path}")
        log.debug("exported %s to %s", what, path)  # printed above: once is enough on the console
    trainer.strategy.barrier("rlhf_lit_export")
    return path


def check_export_at_fit_start(trainer: pl.Trainer, export_dir: str | None, existing: ExportExisting) -> None:
    """Refuse, before any training step, an export target the end of fit would have to refuse.

    Called on every rank (resolving the default path is collective); each sees the same files.
    """
    check_export_target(export_dir or default_export_dir(trainer), existing)

"""Writing a stage's final model and tokenizer in Hugging Face format, atomically, on rank 0.

Lightning checkpoints stay the way to resume; the export is what the next stage (or any
``from_pretrained`` user) loads.

rlhf-lit never deletes or overwrites what it did not write: every export carries a marker file
(:data:`MARKER`), a non-empty directory without it is never replaced, and an earlier export is
replaced only when the stage's ``export_existing`` says ``replace`` (by an atomic swap with the
complete new one). The target is checked when fit starts, so a refusal costs no training.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Literal

import lightning.pytorch as pl
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rlhf_lit.models.sharding import full_state_dict
from rlhf_lit.stages.nonfinite import assert_finite

log = logging.getLogger(__name__)

MARKER = "rlhf_lit_export.json"
"""Written into every export: what it is and when it was written. Only such a directory is ever replaced."""

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
    if not target.exists() and not target.is_symlink():
        return
    if not target.is_dir() or target.is_symlink():
        raise ValueError(f"export_dir {target} exists and is not a directory; choose another export_dir")
    if not any(target.iterdir()):
        return
    marker = target / MARKER
    if not marker.is_file():
        raise ValueError(
            f"export_dir {target} is not empty and was not written by rlhf-lit (no {MARKER}); it is never "
            "replaced: choose another export_dir"
        )
    if existing != "replace":
        try:
            about = json.loads(marker.read_text(encoding="utf-8"))
            what = f" ({about.get('what', 'an export')}, written {about.get('written', '?')})"
        except (OSError, ValueError):
            what = ""
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
) -> Path:
    """Write ``model`` and ``tokenizer`` with ``save_pretrained`` so that ``path`` is never half written.

    ``state_dict``: the weights to write instead of ``model``'s own (the gathered weights of a
    sharded model, :func:`~rlhf_lit.models.sharding.full_state_dict`).

    Everything (and the :data:`MARKER`) is written into a new hidden directory beside ``path``,
    then renamed into place. An earlier export at ``path`` (checked again here with
    :func:`check_export_target`) is moved aside and deleted only after the new one is in place,
    so a crash leaves either the old or the new export, never a mixture.

    Returns:
        The absolute path of the export.
    """
    final = Path(path).absolute()
    check_export_target(final, existing)
    assert_finite(model if state_dict is None else state_dict, what)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))  # new: never someone's
    try:
        model.save_pretrained(tmp, **({} if state_dict is None else {"state_dict": state_dict}))
        tokenizer.save_pretrained(tmp)
        written = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        (tmp / MARKER).write_text(json.dumps({"what": what, "written": written}) + "\n", encoding="utf-8")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # the directory made above, nothing else
        raise
    old = None
    if final.exists():  # an empty directory or an rlhf-lit export (checked above)
        old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
        os.replace(final, old / final.name)  # os.replace cannot replace a non-empty directory
        moved = old / final.name
        if any(moved.iterdir()) and not (moved / MARKER).is_file():
            # Changed since the check: put it back untouched and delete only what this call made.
            os.replace(moved, final)
            shutil.rmtree(tmp)
            old.rmdir()
            raise ValueError(f"export_dir {final} changed while the export was written; it was left as it is")
    try:
        os.replace(tmp, final)
    except OSError:
        if old is not None:
            os.replace(old / final.name, final)  # the earlier export back in place
            old.rmdir()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old)  # holds only the earlier rlhf-lit export (its marker checked just above)
    return final


def export_at_fit_end(
    trainer: pl.Trainer,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    export_dir: str | None,
    what: str,
    existing: ExportExisting = "refuse",
) -> Path | None:
    """Export on global rank 0 only, print and log where; other ranks return None.

    Every rank must call this: resolving the default path (``trainer.log_dir``) is a collective
    broadcast under DDP, gathering a sharded model's weights onto rank 0 is one under FSDP, and a
    barrier after the write lets no rank run ahead of the files.

    Args:
        trainer: The trainer that just finished fitting (its log dir gives the default place).
        model: The Hugging Face model to write (on CPU after fit; Lightning moves it there).
        tokenizer: The run's tokenizer, written next to the model.
        export_dir: Where to write; None means :func:`default_export_dir`.
        what: Words for the message, e.g. ``"SFT model"``.
        existing: What to do with an earlier export at the target (:data:`ExportExisting`).
    """
    target = export_dir or default_export_dir(trainer)  # collective: on every rank
    weights = full_state_dict(model)  # collective when sharded (FSDP): the whole model on rank 0
    path = None
    if trainer.is_global_zero:
        path = save_pretrained_atomically(model, tokenizer, target, what, existing, state_dict=weights)
        print(f"[rlhf-lit] exported {what} to {path}")
        log.debug("exported %s to %s", what, path)  # printed above: once is enough on the console
    trainer.strategy.barrier("rlhf_lit_export")
    return path


def check_export_at_fit_start(trainer: pl.Trainer, export_dir: str | None, existing: ExportExisting) -> None:
    """Refuse, before any training step, an export target the end of fit would have to refuse.

    Called on every rank (resolving the default path is collective); each sees the same files.
    """
    check_export_target(export_dir or default_export_dir(trainer), existing)

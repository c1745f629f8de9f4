"""Writing a stage's final model and tokenizer in Hugging Face format, atomically, on rank 0.

Lightning checkpoints stay the way to resume; the export is what the next stage (or any
``from_pretrained`` user) loads.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import lightning.pytorch as pl
from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)


def default_export_dir(trainer: pl.Trainer) -> str:
    """``<trainer.log_dir or default_root_dir>/model``: next to the run's logs and checkpoints."""
    return os.path.join(trainer.log_dir or trainer.default_root_dir, "model")


def save_pretrained_atomically(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | os.PathLike
) -> Path:
    """Write ``model`` and ``tokenizer`` with ``save_pretrained`` so that ``path`` is never half written.

    Everything is written to ``<path>.tmp-<pid>`` first, then renamed into place. A previous
    export at ``path`` is moved aside and deleted only after the new one is in place, so a crash
    leaves either the old or the new export, never a mixture.

    Returns:
        The absolute path of the export.
    """
    final = Path(path).absolute()
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = final.with_name(f"{final.name}.old-{os.getpid()}")
    if final.exists():
        # os.replace cannot replace a non-empty directory: move the old one aside first.
        os.replace(final, old)
    os.replace(tmp, final)
    if old.exists():
        shutil.rmtree(old)
    return final


def export_at_fit_end(
    trainer: pl.Trainer,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    export_dir: str | None,
    what: str,
) -> Path | None:
    """Export on global rank 0 only, print and log where; other ranks return None.

    Every rank must call this: resolving the default path (``trainer.log_dir``) is a collective
    broadcast under DDP, and a barrier after the write lets no rank run ahead of the files.

    Args:
        trainer: The trainer that just finished fitting (its log dir gives the default place).
        model: The Hugging Face model to write (on CPU after fit; Lightning moves it there).
        tokenizer: The run's tokenizer, written next to the model.
        export_dir: Where to write; None means :func:`default_export_dir`.
        what: Words for the message, e.g. ``"SFT model"``.
    """
    target = export_dir or default_export_dir(trainer)  # collective: on every rank
    path = None
    if trainer.is_global_zero:
        path = save_pretrained_atomically(model, tokenizer, target)
        print(f"[rlhf-lit] exported {what} to {path}")
        log.info("exported %s to %s", what, path)
    trainer.strategy.barrier("rlhf_lit_export")
    return path

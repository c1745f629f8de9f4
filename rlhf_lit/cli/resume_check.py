"""``--ckpt_path``: the checkpoint is checked before anything is built (:mod:`rlhf_lit.integrity`).

torch answers a checkpoint cut short by a crash or a full disk with "PytorchStreamReader failed
reading zip archive: failed finding central directory", a traceback and no file name, after every
model has been loaded. Here it is one line naming the file and what is wrong with it; when the
damaged file is a ``last.ckpt``, the line also names the newest intact checkpoint beside it and the
command that resumes from it (the periodic checkpoints a run keeps next to ``last.ckpt``). The
checkpoints Lightning picks itself (``--ckpt_path last`` / ``best``, SLURM's ``hpc``) are checked
the same way where they are loaded (:func:`check_checkpoints_when_loaded`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from rlhf_lit.callbacks.preemption import resume_command
from rlhf_lit.integrity import DamagedFile, check_checkpoint, newest_intact_checkpoint

LIGHTNING_SPECIAL = ("last", "best", "hpc", "registry")
"""``--ckpt_path`` values Lightning resolves itself (to a file of its callbacks), not paths."""
LAST_NAME = re.compile(r"last(-v\d+)?\.ckpt")
"""Lightning's name for the checkpoint written at the end of fit (``-vN`` when one was already there)."""


class DamagedCheckpoint(ValueError):
    """A ``--ckpt_path`` that is missing or damaged; the message says what to resume from instead."""


def resume_hint(path: str, command: Sequence[str] | None) -> str:
    """What to do about the damaged checkpoint ``path``: for a ``last.ckpt``, the newest intact
    checkpoint beside it and the command resuming from it (or that there is none); else nothing."""
    if not LAST_NAME.fullmatch(os.path.basename(path)):
        return ""
    intact = newest_intact_checkpoint(path)
    if intact is None:
        return "; no intact checkpoint beside it to resume from: start the run again without --ckpt_path"
    shown = os.path.join(os.path.dirname(path), os.path.basename(intact))  # as the user wrote the folder
    again = resume_command(list(command) if command else ["rlhf-lit", "fit"], shown)
    return f"; the newest intact checkpoint beside it is {shown}: resume from it with `{again}`"


def check_resume_checkpoint(
    ckpt_path: str | None, command: Sequence[str] | None = None, label: str | None = None
) -> None:
    """Refuse a ``--ckpt_path`` that does not exist or is damaged, before any model is loaded.

    Args:
        ckpt_path: the path given (None, or one of :data:`LIGHTNING_SPECIAL`: nothing to check).
        command: the command line of the run (``rlhf-lit fit ...``), to write the resume command.
        label: how the message names the checkpoint (default ``--ckpt_path <ckpt_path>``).

    Raises:
        DamagedCheckpoint: one message naming the file, what is wrong and, for ``last.ckpt``, what to
            resume from instead.
    """
    if not ckpt_path or str(ckpt_path) in LIGHTNING_SPECIAL:
        return
    path = str(ckpt_path)
    label = label or f"--ckpt_path {path}"
    if not os.path.exists(os.path.expanduser(path)):
        raise DamagedCheckpoint(f"{label}: no such file")
    try:
        check_checkpoint(os.path.expanduser(path))
    except DamagedFile as error:
        raise DamagedCheckpoint(f"{label}: {error.problem}{resume_hint(path, command)}") from None


class CheckedCheckpointLoad:
    """A strategy's ``load_checkpoint`` that checks the file first (:func:`check_resume_checkpoint`).

    ``--ckpt_path last`` / ``best`` are resolved by Lightning inside fit, and under SLURM Lightning
    resumes from its ``hpc`` checkpoint by itself: those files are first known where they are
    loaded, and are checked there (an explicit path is checked again, cheaply). A module-level
    class, not a closure, so that a strategy sent to spawned processes still pickles.

    Args:
        strategy: the Trainer's strategy; its class's own ``load_checkpoint`` does the loading.
        command: the run's command line, for the resume command of a damaged ``last.ckpt``.
        given: the ``--ckpt_path`` given (``last``, a path, or None).
    """

    def __init__(self, strategy, command: Sequence[str] | None = None, given: str | None = None) -> None:
        self.strategy, self.command, self.given = strategy, list(command) if command else None, given

    def __call__(self, checkpoint_path, *args, **kwargs):
        """Check ``checkpoint_path`` (a local one), then load it as the strategy does."""
        path = os.fspath(checkpoint_path)
        if "://" not in path:
            label = (
                None
                if self.given == path
                else f"--ckpt_path {self.given} ({path})"
                if self.given
                else f"the checkpoint Lightning resumes from by itself ({path})"
            )
            check_resume_checkpoint(path, self.command, label)
        return type(self.strategy).load_checkpoint(self.strategy, checkpoint_path, *args, **kwargs)


def check_checkpoints_when_loaded(strategy, command: Sequence[str] | None = None, given: str | None = None) -> None:
    """Make ``strategy`` check every checkpoint it loads before torch reads it (:class:`CheckedCheckpointLoad`)."""
    if not isinstance(vars(strategy).get("load_checkpoint"), CheckedCheckpointLoad):
        strategy.load_checkpoint = CheckedCheckpointLoad(strategy, command, given)

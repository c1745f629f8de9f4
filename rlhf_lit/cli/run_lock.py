"""One ``fit`` at a time per run directory and stage: a second run refuses in one line naming the first.

Two runs of one stage in one ``--run_dir`` would write the same ``last.ckpt``, the same export and
(Lightning picks ``version_N`` by listing the folder) possibly the same log folder, each over the
other's. So a ``fit`` with ``--run_dir`` holds an exclusive lock on ``<run_dir>/<stage>/.rlhf-lit.lock``
from before any model is built until it ends; the lock file records the holder's pid, host, start
time and command line, which the refused run prints.

The lock is ``fcntl.flock``: the kernel drops it when the holding process dies, SIGKILL and crashes
included, so a killed run never leaves a stuck lock (its lock file may stay behind; the next run
takes it over). The file is removed when the run ends. Only the first process of a run takes the
lock: the other ranks of a multi-process run are the same run. Where ``flock`` is not available
(not POSIX, or a file system without locks) the run goes on with a warning.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import shlex
import socket
from collections.abc import Sequence

try:
    import fcntl
except ImportError:  # Windows: no flock; runs are not locked (a warning says so)
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

LOCK_NAME = ".rlhf-lit.lock"
"""The lock file in ``<run_dir>/<stage>/``."""
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID")
"""Set by launchers (Lightning's, torchrun, SLURM) in every process of a run: only rank 0 locks."""


class RunLocked(ValueError):
    """Another ``fit`` of the same stage holds the run directory; the message names it."""


def is_first_process() -> bool:
    """Whether this process is the first (or only) one of its run, by the launchers' rank variables."""
    return all(os.environ.get(name, "0").strip() in ("", "0") for name in RANK_VARIABLES)


def _holder(handle) -> str:
    """How the lock file's holder described itself, in words (or that it did not)."""
    try:
        handle.seek(0)
        about = json.loads(handle.read() or "{}")
        return f"pid {about['pid']} on {about['host']}, started {about['started']}: {shlex.join(about['command'])}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not written its details yet"


class RunLock:
    """An exclusive lock on ``<folder>/.rlhf-lit.lock``, held until :meth:`release` (or the process ends).

    Args:
        folder: the stage's folder in the run directory (created when missing).
        what: words for the message (``--run_dir runs/exp1: the SFT stage``).
        command: the command line of this run, recorded for the message a second run prints.

    Raises:
        RunLocked: another live process holds the lock.
    """

    def __init__(self, folder: str, what: str, command: Sequence[str] | None = None) -> None:
        self.folder, self.path, self.handle = folder, os.path.join(folder, LOCK_NAME), None
        self.created_folder = not os.path.isdir(folder)
        os.makedirs(folder, exist_ok=True)
        while self.handle is None:
            handle = _open_lock_file(self.path, what)
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(handle)
                handle.close()
                raise RunLocked(
                    f"{what} is already running there ({holder}); wait for it to end, or give another "
                    f"--run_dir (lock file {self.path})"
                ) from None
            except OSError as error:  # no locks on this file system: say so, never block the run
                handle.close()
                log.warning(
                    "%s: cannot lock %s (%s); two runs started here at once are not told apart", what, self.path, error
                )
                return
            # The holder before us may have removed the file between our open and our flock: then we
            # hold a lock on a name nobody else opens. Lock the file that is there now instead.
            try:
                same = os.path.samestat(os.fstat(handle.fileno()), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                self.handle = handle
            else:
                handle.close()
        about = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": list(command or ["rlhf-lit", "fit"]),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        self.handle.seek(0)
        self.handle.truncate()
        self.handle.write(json.dumps(about) + "\n")
        self.handle.flush()

    def release(self) -> None:
        """Remove the lock file and drop the lock (removed first, while held: no one can take over a
        file that is about to vanish); an empty stage folder this lock created is removed too."""
        if self.handle is None:
            return
        try:
            # only the file this lock opened and wrote: never whatever was put at that name since
            if os.path.samestat(os.fstat(self.handle.fileno()), os.lstat(self.path)):
                os.unlink(self.path)
            if self.created_folder:
                os.rmdir(self.folder)  # only when empty: a refused run leaves no trace
        except OSError:
            pass
        self.handle.close()  # closing drops the flock
        self.handle = None


def _open_lock_file(path: str, what: str):
    """``path`` opened for reading and appending, created when missing, never through a symbolic link:
    the lock file is truncated and later removed, which must not reach a file rlhf-lit did not write."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as error:
        raise RunLocked(
            f"{what}: the lock file {path} cannot be opened as a plain file ({error.strerror}); "
            "remove what is at that name or give another --run_dir"
        ) from None
    return os.fdopen(fd, "a+", encoding="utf-8")


_held: list[RunLock] = []


def lock_run(folder: str, what: str, command: Sequence[str] | None) -> None:
    """Take the lock on ``folder`` for this process's run (first process only; a no-op without flock).

    Released by :func:`release_run_locks`, which the CLI calls when the command ends."""
    if not is_first_process():
        return
    if fcntl is None:
        log.warning("%s: file locks are not available here; two runs started at once are not told apart", what)
        return
    _held.append(RunLock(folder, what, command))


def release_run_locks() -> None:
    """Release every lock :func:`lock_run` took (the CLI's ``main`` calls it in a ``finally``)."""
    while _held:
        _held.pop().release()

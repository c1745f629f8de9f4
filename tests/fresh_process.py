"""Make a process forked from the test's process look like one just started (``cli_forked``'s children):
its streams on file descriptors 1 and 2, a fresh interpreter's logging, warnings filters, signal
handlers, environment, working directory, ``sys.argv``, ``__main__`` and the library state a new
process starts with."""

from __future__ import annotations

import atexit
import faulthandler
import io
import logging
import os
import random
import signal
import sys
import types
import warnings
import weakref
from pathlib import Path


def _default_warnings() -> None:
    """The warnings filters and printer a fresh interpreter starts with."""
    warnings.resetwarnings()  # (also forgets which warnings were already shown: the registries' version moves)
    for action, category, module in (
        ("default", DeprecationWarning, "__main__"),
        ("ignore", DeprecationWarning, ""),
        ("ignore", PendingDeprecationWarning, ""),
        ("ignore", ImportWarning, ""),
        ("ignore", ResourceWarning, ""),
    ):
        warnings.filterwarnings(action, category=category, module=module, append=True)
    warnings.showwarning = warnings._showwarning_orig  # not pytest's recorder


def _loggers() -> list[logging.Logger]:
    """The root logger and every logger created so far."""
    return [
        logging.getLogger(),
        *(v for v in logging.Logger.manager.loggerDict.values() if isinstance(v, logging.Logger)),
    ]


def streams_on_fds(old: tuple[object, ...]) -> None:
    """``sys.stdout`` / ``sys.stderr`` on file descriptors 1 and 2, and every logging handler that
    wrote to a stream of the test's process writing to them instead (stdout's to stdout)."""
    out = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", write_through=True)
    err = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True
    )
    old_out = {id(stream) for stream in old[:2]}
    sys.stdout = sys.__stdout__ = out
    sys.stderr = sys.__stderr__ = err
    for logger in _loggers():
        for handler in logger.handlers:
            if (
                isinstance(handler, logging.StreamHandler)
                and not isinstance(handler, logging.FileHandler)
                and not isinstance(getattr(type(handler), "stream", None), property)
            ):  # (those follow sys.stderr)
                # not setStream: it flushes the old stream, which an earlier test may have closed
                handler.stream = out if id(handler.stream) in old_out else err


def fresh_logging() -> None:
    """The logging set-up of a fresh interpreter: none of pytest's handlers (on the root logger and
    every logger that does not propagate), and Lightning's loggers as their import leaves them under a
    root without handlers (a handler of their own, not propagating): in the test process pytest's
    handlers may have come first, and Lightning's messages then went up to the root and out once more."""
    root = logging.getLogger()
    for logger in _loggers():
        for handler in list(logger.handlers):
            if type(handler).__module__.startswith("_pytest"):
                logger.removeHandler(handler)
    root.setLevel(logging.WARNING)
    for name in ("lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        if name in logging.Logger.manager.loggerDict and not root.handlers and not logger.handlers:
            logger.addHandler(logging.StreamHandler())  # (on sys.stderr, the fork's)
            logger.propagate = False


def fresh_process(argv: list[str], cwd: Path, environ: dict[str, str]) -> None:
    """Make this (forked) process look like one just started with ``argv`` in ``cwd`` with ``environ``."""
    # Exit handlers and weakref finalizers of the test's process are its own (its temporary folders).
    atexit._clear()
    for info in weakref.finalize._registry.values():  # noqa: SLF001
        info.atexit = False
    weakref.finalize._registered_with_atexit = False  # noqa: SLF001  (this process's own register again)
    for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGALRM):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    # A crash (SIGSEGV, SIGABRT) prints every thread's Python stack on the fork's own stderr, which the
    # test reads (the test process's handler writes to the worker's stderr, out of the test's sight).
    # (disable first: enable on an enabled handler only changes its file, and a library may have put
    # its own SIGSEGV handler over the test process's since)
    faulthandler.disable()
    faulthandler.enable(file=sys.stderr, all_threads=True)
    _default_warnings()
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    sys.argv = list(argv)
    main_module = types.ModuleType("__main__")
    main_module.__file__, main_module.__spec__ = argv[0], None  # Lightning re-runs `python <argv[0]> <args>`
    sys.modules["__main__"] = main_module

    import numpy as np
    import torch
    from lightning.fabric.utilities.rank_zero import _get_rank, rank_zero_only
    from transformers.utils import logging as hf_logging

    import rlhf_lit.cli
    from rlhf_lit.sources import _hub_reachable

    rank_zero_only.rank = _get_rank() or 0  # set at import from the environment (a forked rank's is its own)
    rlhf_lit.cli._debug = False  # noqa: SLF001
    # What this process compiled is the test process's: a new interpreter starts with no compiled graph and
    # its compiled-generation totals at 0 (a run that prints or asserts them counts its own compiles only).
    from rlhf_lit.models import compiled_generation

    vars(compiled_generation.COMPILE_STATS).update(vars(compiled_generation.CompileStats()))
    if "torch._dynamo" in sys.modules:
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()  # unique_graphs and the rest, which reset() keeps
    hf_logging.enable_progress_bar()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.set_default_dtype(torch.float32)
    torch.seed()
    np.random.seed()
    random.seed()
    _hub_reachable.cache_clear()

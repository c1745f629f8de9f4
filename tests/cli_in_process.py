"""``rlhf-lit`` in the test's own process: ``rlhf_lit.cli.main(args)`` with its output captured and the
process's global state restored afterwards.

Importing the CLI in a fresh process costs about 5 s on the development machines, so the tests of
error messages, config parsing and short runs call the entry function directly; the suite keeps
real subprocesses (``cli_helpers.rlhf_lit``) for one case of each message format and for the runs
whose terminal output or process handling is the point. :func:`run_main` returns the same
:class:`subprocess.CompletedProcess` a subprocess run does, so a test's assertions read the same.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import random
import subprocess
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from suite_env import subprocess_env

_LOGGERS = (
    "rlhf_lit",
    "lightning.pytorch.utilities.rank_zero",
    "lightning.fabric.utilities.rank_zero",
    "transformers.modeling_utils",
    "lightning.pytorch",
    "lightning.fabric",
)
"""The loggers main() configures (handlers, filters, level): saved and restored around an in-process run."""


@contextlib.contextmanager
def isolated_main_state(cwd: Path, env: dict[str, str] | None = None) -> Iterator[None]:
    """Run the body in ``cwd`` in the suite's environment plus ``env`` (:func:`suite_env.subprocess_env`:
    what a subprocess of the test would get), then put back everything ``rlhf_lit.cli.main`` may
    change in the process: the working directory, ``os.environ`` (the debug switch, Lightning's
    ``PL_GLOBAL_SEED``), ``sys.argv``, the warnings filters, the handlers / filters / levels of the
    loggers it configures, the CLI's debug flag, transformers' progress-bar switch, torch's thread
    count and default dtype, the random states of torch, numpy and ``random`` (``seed_everything``
    reseeds them all), and the hub probe's answer (``rlhf_lit.sources`` asks once per process: a run
    with another ``HF_ENDPOINT`` asks again)."""
    from transformers.utils import logging as hf_logging

    import rlhf_lit.cli
    from rlhf_lit.sources import _hub_reachable

    saved_env, saved_argv, saved_cwd = dict(os.environ), list(sys.argv), os.getcwd()
    saved_loggers = {}
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        saved_loggers[name] = (list(logger.handlers), list(logger.filters), logger.level, logger.propagate)
    # A fresh handler for rlhf-lit's own messages, created by main() on the captured stderr.
    logging.getLogger("rlhf_lit").handlers = [
        h for h in logging.getLogger("rlhf_lit").handlers if not getattr(h, "_rlhf_lit", False)
    ]
    saved_debug, saved_bar = rlhf_lit.cli._debug, hf_logging.is_progress_bar_enabled()
    saved_threads, saved_dtype = torch.get_num_threads(), torch.get_default_dtype()
    saved_rng = (torch.random.get_rng_state(), np.random.get_state(), random.getstate())
    run_env = subprocess_env(env)
    os.environ.clear()
    os.environ.update(run_env)
    _hub_reachable.cache_clear()
    sys.argv = ["rlhf-lit"]
    os.chdir(cwd)
    try:
        with warnings.catch_warnings():  # restores the filters main() installs (rlhf_lit.expected_warnings)
            yield
    finally:
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
        _hub_reachable.cache_clear()
        for name, (handlers, filters, level, propagate) in saved_loggers.items():
            logger = logging.getLogger(name)
            logger.handlers, logger.filters, logger.propagate = handlers, filters, propagate
            logger.setLevel(level)
        rlhf_lit.cli._debug = saved_debug
        (hf_logging.enable_progress_bar if saved_bar else hf_logging.disable_progress_bar)()
        torch.set_num_threads(saved_threads)
        torch.set_default_dtype(saved_dtype)
        torch.random.set_rng_state(saved_rng[0])
        np.random.set_state(saved_rng[1])
        random.setstate(saved_rng[2])


def run_entry(
    entry: Callable[[list[str]], int | None], *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``entry(args)``, a command's ``main(argv)``, in this process as a subprocess would run it.

    Returns what the process would have: the exit status (``main``'s return value, or ``sys.exit``'s
    code; 1 and the traceback on stderr for an exception ``main`` lets through, as the interpreter
    does), and stdout / stderr as written while it ran. Global state is restored by
    :func:`isolated_main_state`.
    """
    stdout, stderr = io.StringIO(), io.StringIO()
    with isolated_main_state(cwd, env), contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            returned = entry(list(args))
            status = returned if isinstance(returned, int) else 0  # `sys.exit(main())` of the console script
        except SystemExit as done:
            if done.code is None or isinstance(done.code, int):
                status = done.code or 0
            else:  # sys.exit("message"): printed to stderr, status 1
                print(done.code, file=sys.stderr)
                status = 1
        except Exception:  # noqa: BLE001  (what an uncaught exception does to the process)
            traceback.print_exc(file=sys.stderr)
            status = 1
    return subprocess.CompletedProcess(
        [getattr(entry, "__module__", "main"), *args], status, stdout.getvalue(), stderr.getvalue()
    )


def run_main(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``rlhf-lit <args>`` as ``rlhf_lit.cli.main(args)`` in this process (:func:`run_entry`), as
    ``cli_helpers.rlhf_lit`` runs it in a subprocess."""
    from rlhf_lit.cli import main

    return run_entry(main, *args, cwd=cwd, env=env)

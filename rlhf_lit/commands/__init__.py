"""Commands of ``rlhf-lit`` beside LightningCLI's ``fit``: ``evaluate``, ``best-of-n``, ``export-policy``, ``frontier``, ``seeds`` and ``iterate``.

``rlhf_lit.cli.main`` hands ``rlhf-lit <command> ...`` to :func:`run_command` when ``<command>``
is in :data:`COMMANDS`; everything else goes to LightningCLI. Each command is an argparse
``main(argv) -> exit status`` in its own module, imported only when run: a thin shell that parses
and checks the options (:mod:`rlhf_lit.commands.options`), calls the library function (of
:mod:`rlhf_lit.evaluation`, or :mod:`rlhf_lit.stages.checkpoint_export`) and writes its result. Errors read as the rest
of rlhf-lit's: one line ``rlhf-lit: error: ...``, exit status 2 for a bad option and 1 for
anything else a user can fix (a missing file or model, bad data, a judge that does not import);
``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

COMMANDS: dict[str, tuple[str, str]] = {
    "evaluate": (
        "rlhf_lit.commands.evaluate_command",
        "sample from a policy on prompts: judge, RM score, KL, distinct-n, length",
    ),
    "best-of-n": (
        "rlhf_lit.commands.best_of_n_command",
        "best-of-N by a reward model over N = 1, 2, 4, ...: judge score and analytic KL",
    ),
    "export-policy": (
        "rlhf_lit.commands.export_policy_command",
        "the policy of a training checkpoint (or of each rollout=<n>.ckpt) as an export",
    ),
    "frontier": (
        "rlhf_lit.commands.frontier_command",
        "judge or RM score against KL over evaluate (and best-of-n) results: table, plot",
    ),
    "seeds": (
        "rlhf_lit.commands.seeds_command",
        "run a command (after --) once per seed: --seed_everything S, --run_dir DIR/seed_S",
    ),
    "iterate": (
        "rlhf_lit.commands.iterate_command",
        "iterated RLHF: label the policy's samples, refit the reward model, PPO; T times",
    ),
}
"""``command -> (module with main(argv), one-line help)``."""


def commands_help() -> str:
    """The extra commands, one line each, for ``rlhf-lit --help``."""
    width = max(len(name) for name in COMMANDS)
    lines = [f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items()]
    return "rlhf-lit commands besides LightningCLI's (`rlhf-lit <command> --help` for options):\n" + "\n".join(lines)


def run_command(name: str, argv: Sequence[str], debug: bool = False) -> int:
    """Run command ``name`` with ``argv``; returns the exit status (errors as one line unless ``debug``)."""
    from rlhf_lit.commands.options import OptionError

    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a "Loading weights" bar per model would bury the table
        return importlib.import_module(COMMANDS[name][0]).main(argv)
    except SystemExit as done:  # argparse: --help (0) or a bad option (2, its message already printed)
        return done.code if isinstance(done.code, int) else 1
    except (ValueError, OSError, ImportError) as error:
        if debug:
            raise
        status = 2 if isinstance(error, OptionError) else 1
        hint = f"`rlhf-lit {name} --help` lists the options" if status == 2 else "run with --debug for the traceback"
        sys.stderr.write(f"rlhf-lit: error: {error}\n({hint})\n")
        return status

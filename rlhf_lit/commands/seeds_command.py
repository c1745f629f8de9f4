"""``rlhf-lit seeds``: one ``rlhf-lit`` run per seed, each in its own run directory.

    rlhf-lit seeds --seeds 0 1 2 -- fit --config configs/offline/ppo.yaml --run_dir runs/exp \\
        --model.init_args.sft_model logs/offline/sft/model \
        --model.init_args.reward_model logs/offline/reward_model/model

runs ``rlhf-lit fit ... --run_dir runs/exp/seed_S --seed_everything S`` for S = 0, 1, 2: the command
after ``--`` as given, with its ``--run_dir DIR`` (required) suffixed per seed, ``DIR/seed_S``, and
``--seed_everything S`` added (the command must not set it). Each run is a process of its own whose
output goes to ``DIR/seed_S.log`` (appended to); the runs go one after another, or ``--jobs N`` at
a time. The first run that fails stops the rest (runs already going are let finish) with one line
``rlhf-lit: error: seed S failed (exit status N): <its last error line>; its log: DIR/seed_S.log``,
exit status 1. Each seed's run directory and log are printed. The runs are :mod:`rlhf_lit.child_runs`': SIGTERM
or SIGINT to ``rlhf-lit seeds`` stops the running ones with SIGTERM, and they are waited for (a fit ends its step and
writes ``last.ckpt``; killed after :data:`~rlhf_lit.child_runs.GRACE_S` s), and it exits with status 143 or 130.

Resumable: a seed whose run directory already holds the finished export of the command's stage is
skipped. The stage is the ``--model`` class (an option, or ``model.class_path`` of the last
``--config`` naming one); its export is finished when ``DIR/seed_S/<stage>/model`` holds the
export marker ``rlhf_lit_export.json`` (:data:`rlhf_lit.artifacts.EXPORT_MARKER`, written last, when
the export is complete). Where the stage cannot be told, no seed is skipped (a fresh ``fit`` whose
export exists then stops at once, as ``--run_dir`` has it).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from rlhf_lit.artifacts import EXPORT_MARKER
from rlhf_lit.callable_specs import import_class
from rlhf_lit.child_runs import RunFailed, rlhf_lit_command, run_logged, run_pool, stop_on_signals
from rlhf_lit.commands.options import CommandParser, OptionError
from rlhf_lit.run_seed import run_seed_problem


def build_parser() -> CommandParser:
    """The options of ``rlhf-lit seeds`` (the command to run follows ``--``)."""
    parser = CommandParser(
        prog="rlhf-lit seeds",
        usage="rlhf-lit seeds --seeds S [S ...] [--jobs N] -- <command> ... --run_dir DIR ...",
        description="Run an rlhf-lit command (after --) once per seed, with --seed_everything S and its --run_dir DIR "
        "suffixed to DIR/seed_S; each run's output goes to DIR/seed_S.log. A seed whose run directory holds the "
        "stage's finished export is skipped; the first failure stops the rest.",
    )
    parser.add_argument("--seeds", nargs="+", type=int, required=True, metavar="S", help="the seeds, one run each")
    parser.add_argument("--jobs", type=int, default=1, metavar="N", help="runs at a time")
    return parser


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(seeds options, command)``: the parts before and after the first ``--``."""
    argv = list(argv)
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def run_dir_of(command: Sequence[str]) -> tuple[str, int, bool]:
    """``(DIR, index, joined)`` of the command's one ``--run_dir``; :class:`OptionError` without exactly one."""
    found = [
        (i, arg.startswith("--run_dir="))
        for i, arg in enumerate(command)
        if arg == "--run_dir" or arg.startswith("--run_dir=")
    ]
    if len(found) != 1:
        raise OptionError(
            "the command after -- needs one --run_dir DIR (each seed runs in DIR/seed_S)"
            if not found
            else "--run_dir is given more than once in the command after --"
        )
    index, joined = found[0]
    if joined:
        return command[index].split("=", 1)[1], index, True
    if index + 1 >= len(command) or command[index + 1].startswith("--"):
        raise OptionError("--run_dir in the command after -- needs a directory")
    return command[index + 1], index, False


def seed_command(command: Sequence[str], seed: int, seed_dir: str) -> list[str]:
    """The command of one seed: ``--run_dir`` set to ``seed_dir``, ``--seed_everything seed`` added."""
    _, index, joined = run_dir_of(command)
    command = list(command)
    if joined:
        command[index] = f"--run_dir={seed_dir}"
    else:
        command[index + 1] = seed_dir
    return [*command, "--seed_everything", str(seed)]


def model_class_path(config: str) -> str | None:
    """The stage class a ``fit`` config file names (``model.class_path``, or ``model`` as a string), or None.
    ``OSError`` when it cannot be read, ``ValueError`` naming the file when it is not a YAML mapping
    (:func:`rlhf_lit.config_files.read_yaml_mapping`)."""
    from rlhf_lit.config_files import read_yaml_mapping

    model = read_yaml_mapping(config).get("model")
    class_path = model.get("class_path") if isinstance(model, dict) else model
    return class_path if isinstance(class_path, str) else None


def stage_of(command: Sequence[str]) -> str | None:
    """The run-directory stage of the command's ``--model`` (the option, or the last ``--config`` naming one), or None."""
    class_path = None
    for i, arg in enumerate(command):
        value = arg.split("=", 1)[1] if "=" in arg else command[i + 1] if i + 1 < len(command) else None
        if value is None:
            continue
        if arg.split("=", 1)[0] in ("--model", "--model.class_path"):
            class_path = value
        elif arg.split("=", 1)[0] == "--config" and os.path.isfile(value):
            try:
                class_path = model_class_path(value) or class_path
            except (OSError, ValueError):
                continue  # the command reports it
    if class_path is None:
        return None
    if "." not in class_path:
        class_path = f"rlhf_lit.stages.{class_path}"
    # the stage's run_layout (rlhf_lit.stages.base.RunLayout), as --run_dir reads it
    name = getattr(getattr(import_class(class_path), "run_layout", None), "name", None)
    return name if isinstance(name, str) else None


def finished_export(seed_dir: str, stage: str | None) -> str | None:
    """The stage's export in ``seed_dir`` if it is finished (holds the export marker), else None."""
    if stage is None:
        return None
    export = os.path.join(seed_dir, stage, "model")
    return export if os.path.isfile(os.path.join(export, EXPORT_MARKER)) else None


def main(argv: Sequence[str]) -> int:
    """Run ``rlhf-lit seeds`` with ``argv`` (the options after the command name); returns the exit status."""
    options, command = split_argv(argv)
    args = build_parser().parse_args(options)
    if not command:
        raise OptionError("give the command to run after --, e.g. -- fit --config X.yaml --run_dir runs/exp")
    if args.jobs < 1:
        raise OptionError(f"--jobs must be at least 1, got {args.jobs}")
    for seed in args.seeds:
        if problem := run_seed_problem(seed, "--seeds"):
            raise OptionError(problem)
    if len(set(args.seeds)) < len(args.seeds):
        raise OptionError(f"--seeds: a seed is given twice ({' '.join(map(str, args.seeds))})")
    if any(arg == "--seed_everything" or arg.startswith("--seed_everything=") for arg in command):
        raise OptionError("the command after -- sets --seed_everything; rlhf-lit seeds sets it per seed")
    run_dir, _, _ = run_dir_of(command)
    stage = stage_of(command)
    todo = []
    for seed in args.seeds:
        seed_dir = os.path.join(run_dir, f"seed_{seed}")
        export = finished_export(seed_dir, stage)
        if export is not None:
            print(f"seed {seed}: skipped, {export} holds a finished export ({EXPORT_MARKER})", flush=True)
        else:
            todo.append((seed, seed_dir, f"{seed_dir}.log"))

    def run_seed(job: tuple[int, str, str]) -> None:
        seed, seed_dir, log_path = job
        print(f"seed {seed}: running in {seed_dir} (log {log_path})", flush=True)
        run_logged(rlhf_lit_command(seed_command(command, seed, seed_dir)), log_path, f"seed {seed}")
        print(f"seed {seed}: done: {seed_dir} (log {log_path})", flush=True)

    with stop_on_signals("seeds"):
        try:
            run_pool(run_seed, todo, args.jobs)
        except RunFailed as failure:
            sys.stderr.write(f"rlhf-lit: error: {failure}\n")
            return 1
    return 0

"""``rlhf-lit frontier``: the score-against-KL frontier over evaluation results, as a table, a plot and JSON.

    rlhf-lit frontier --eval SFT=eval/sft.json "PPO:rollout 10=eval/r10.json" "PPO:rollout 20=eval/r20.json" \\
        DPO=eval/dpo.json --best-of-n bon.json --score rm --plot frontier.png --out frontier.json

Each ``--eval`` is ``[METHOD[:SETTING]=]FILE``, a result of ``rlhf-lit evaluate`` run with
``--reference`` (and ``--judge`` or ``--reward-model`` for the score): one point, its mean KL and
mean score with the standard error over responses. The points of one METHOD are joined in the order
given (a run's checkpoints, ``rlhf-lit export-policy``); without METHOD a file is a method of its
own, named by the file. A ``METHOD:SETTING`` given several times (one run on several seeds) is one
point: the mean over its results, with the standard error over them. ``--best-of-n`` adds the points of an ``rlhf-lit best-of-n`` sweep (analytic
KL). Compare only results measured on the same prompts, sampling settings and reference.

This module is the argparse shell: it reads the results and calls :mod:`rlhf_lit.evaluation.frontier`;
``--out`` is written by the commands' rule (``written_by``, ``--overwrite``), and an existing
``--plot`` file is never replaced (a PNG does not say who wrote it).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from rlhf_lit.commands.option_checks import check_distinct_files
from rlhf_lit.commands.options import WRITTEN_BY_KEY, CommandParser, OptionError, add_out_options, check_out, write_json


def build_parser() -> CommandParser:
    """The options of ``rlhf-lit frontier``."""
    parser = CommandParser(
        prog="rlhf-lit frontier",
        description="Judge or RM score against KL to the reference, one point per rlhf-lit evaluate result (and per N "
        "of an rlhf-lit best-of-n sweep): a markdown table, a PNG plot and a JSON of the points.",
    )
    parser.add_argument(
        "--eval",
        dest="evals",
        nargs="+",
        action="extend",
        default=[],
        metavar="[METHOD[:SETTING]=]FILE",
        help="rlhf-lit evaluate results (with --reference); one METHOD's points are joined in this order, "
        "and one METHOD:SETTING given several times (seeds) is their mean",
    )
    parser.add_argument("--best-of-n", default=None, metavar="FILE", help="an rlhf-lit best-of-n result")
    parser.add_argument(
        "--score",
        choices=["judge", "rm"],
        default="judge",
        help="the judge's score (evaluated with --judge) or the reward model's (--reward-model)",
    )
    parser.add_argument("--reference-name", default="SFT", help="what the KL is to, on the axis and in the table")
    parser.add_argument("--title", default=None, help="the plot's title (default: '<score> against KL to <reference>')")
    parser.add_argument("--plot", default=None, metavar="FILE.png", help="draw the frontier here (needs matplotlib)")
    add_out_options(parser, "JSON of the points")
    return parser


def parse_spec(spec: str) -> tuple[str, str, str]:
    """``[METHOD[:SETTING]=]FILE`` -> ``(method, setting, file)``; without METHOD the file names the method.

    A spec that is an existing file is a file, ``=`` in its name or not (``rollout=10.json``).
    """
    label, sep, path = spec.partition("=")
    if not sep or os.path.exists(spec):
        return Path(spec).stem, "-", spec
    method, _, setting = label.partition(":")
    if not method.strip() or not path:
        raise OptionError(f"--eval {spec!r}: give [METHOD[:SETTING]=]FILE")
    return method, setting or "-", path


def read_result(option: str, path: str, command: str) -> dict:
    """The JSON object in the file ``path`` given to ``option`` (what ``rlhf-lit <command>`` wrote).

    Raises:
        ValueError: naming the option and the file: it is missing, a directory, unreadable, damaged (cut short,
            not JSON) or not a JSON object; before any point is drawn.
    """
    from rlhf_lit.integrity import DamagedFile, check_json_file

    if os.path.isdir(path):
        raise ValueError(f"{option} {path}: a directory, not a file; give the JSON file rlhf-lit {command} wrote")
    if not os.path.exists(path):
        raise ValueError(f"{option} {path}: no such file")
    try:
        return check_json_file(path)  # type: ignore[return-value]  (an object: want_object)
    except DamagedFile as damage:
        raise ValueError(f"{option} {damage}") from None  # it starts with the path
    except OSError as error:
        raise ValueError(f"{option} {path}: {error.strerror or error}") from None


def main(argv: Sequence[str]) -> int:
    """Run ``rlhf-lit frontier`` with ``argv`` (the options after the command name); returns the exit status."""
    from rlhf_lit.evaluation.frontier import (
        SCORE_LABELS,
        draw_frontier,
        frontier_table,
        mean_over_runs,
        point_from_evaluation,
        points_from_best_of_n,
    )

    args = build_parser().parse_args(list(argv))
    if not args.evals and args.best_of_n is None:
        raise OptionError("give at least one --eval result or a --best-of-n result")
    specs = [parse_spec(spec) for spec in args.evals]
    check_out(args.out, args.overwrite)
    if args.plot is not None and os.path.lexists(args.plot):
        raise OptionError(f"--plot {args.plot} exists; it is never replaced: delete it or choose another file")
    inputs = {"--eval": [path for _, _, path in specs], "--best-of-n": [args.best_of_n]}
    check_distinct_files({"--plot": args.plot, "--out": args.out}, inputs)
    points = []
    for method, setting, path in specs:
        result = read_result("--eval", path, "evaluate")
        if not isinstance(result.get("samples"), list):
            raise ValueError(f"--eval {path}: not an rlhf-lit evaluate result (no samples)")
        try:
            points.append(point_from_evaluation(result, method, setting, args.score))
        except ValueError as error:
            raise ValueError(f"--eval {path}: {error}") from None
    if args.best_of_n is not None:
        sweep = read_result("--best-of-n", args.best_of_n, "best-of-n")
        if not isinstance(sweep.get("rows"), list) or "config" not in sweep:
            raise ValueError(f"--best-of-n {args.best_of_n}: not an rlhf-lit best-of-n result (no rows)")
        try:
            points += points_from_best_of_n(sweep, score=args.score)
        except ValueError as error:
            raise ValueError(f"--best-of-n {args.best_of_n}: {error}") from None
    points = mean_over_runs(points)  # one setting given several times (seeds): their mean
    label = SCORE_LABELS[args.score]
    print("\n".join(frontier_table(points, label, args.reference_name)))
    if args.plot is not None:
        title = args.title or f"{label[0].upper()}{label[1:]} against KL to {args.reference_name}"
        draw_frontier(
            points, args.plot, title=title, ylabel=label, xlabel=f"KL to {args.reference_name} (nats per response)"
        )
        print(f"wrote {args.plot}")
    if args.out is not None:
        write_json(
            args.out,
            {
                WRITTEN_BY_KEY: "rlhf-lit frontier",
                "score": args.score,
                "reference": args.reference_name,
                "points": [p.__dict__ for p in points],
            },
        )
        print(f"wrote {args.out}")
    return 0

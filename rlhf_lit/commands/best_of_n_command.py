"""``rlhf-lit best-of-n``: best-of-N sampling by a reward model (or a judge), swept over N, with its analytic KL.

    rlhf-lit best-of-n --policy logs/offline/sft/model --reward-model logs/offline/reward_model/model \\
        --prompts prompts.txt --judge rlhf_lit.evaluation.judges:vader --n-max 64 --out bon.json

M responses are sampled once per prompt and every N of the sweep is evaluated on those same
samples (``--estimator subsets``: the exact expectation over all N-subsets; ``first_n``: nested
prefixes); per N it reports the pick's judge score, RM score, length and the analytic KL. The
method is described in :mod:`rlhf_lit.evaluation.best_of_n_sweep`. ``--pick-by judge`` picks by the
judge's score instead (no reward model needed). ``--pairs-out FILE.jsonl`` also writes, per prompt, the
best and the worst of its first N samples (N the sweep's largest) with N recorded: BoNBoN's training
data (:mod:`rlhf_lit.evaluation.best_of_n_pairs`).

This module is the argparse shell: it parses and checks the options, calls the library function
:func:`rlhf_lit.evaluation.best_of_n_sweep.best_of_n`, prints the table and writes the JSON.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import get_args

from rlhf_lit.artifacts import write_jsonl_atomically
from rlhf_lit.commands.option_checks import check_distinct_files
from rlhf_lit.commands.options import (
    CommandParser,
    OptionError,
    add_common_options,
    check_out,
    check_positive,
    command_result,
    library_options,
    prepare,
    write_result,
)
from rlhf_lit.evaluation.best_of_n_pairs import best_worst_pairs
from rlhf_lit.evaluation.best_of_n_sweep import PickBy, best_of_n, format_table

log = logging.getLogger(__name__)


def powers_of_two(n_max: int) -> list[int]:
    """``1, 2, 4, ...`` up to ``n_max``, and ``n_max`` itself when it is not a power of two."""
    check_positive(n_max=n_max)
    ns = [2**k for k in range(n_max.bit_length()) if 2**k <= n_max]
    return ns if ns[-1] == n_max else [*ns, n_max]


def parse_n_list(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``: distinct positive integers, sorted (else :class:`OptionError`)."""
    try:
        ns = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise OptionError(f"--n {text!r}: give comma-separated integers, e.g. 1,2,4,8") from None
    if not ns or ns[0] < 1:
        raise OptionError(f"--n {text!r}: give integers >= 1")
    return ns


def build_parser() -> CommandParser:
    """The options of ``rlhf-lit best-of-n``."""
    parser = CommandParser(
        prog="rlhf-lit best-of-n",
        description="Sample M responses per prompt once, pick the best of N by a reward model (or the judge: "
        "--pick-by judge) for N in a sweep, "
        "and report the pick's judge score, RM score and length with the analytic KL log N - (N-1)/N.",
    )
    parser.add_argument("--policy", required=True, metavar="DIR", help="the model to sample from")
    parser.add_argument(
        "--reward-model",
        default=None,
        metavar="DIR",
        help="the reward model that picks the best (an ensemble directory: its members' mean); required unless "
        "--pick-by judge, where it is only scored",
    )
    parser.add_argument(
        "--pick-by",
        choices=get_args(PickBy),
        default="reward_model",
        help="whose score picks the best of N: the reward model's, or the --judge's (best-of-N by the gold score)",
    )
    parser.add_argument(
        "--pairs-out",
        default=None,
        metavar="FILE.jsonl",
        help="also write per prompt the best and the worst of its first N samples (N the largest of the sweep), "
        "with N recorded: preference pairs for BoNBoN (rlhf_lit.stages.BoNBoNModule); prompts whose best and "
        "worst tie are left out; --overwrite replaces only a file rlhf-lit wrote",
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--n-max", type=int, default=64, help="sweep N = 1, 2, 4, ... up to this")
    which.add_argument("--n", default=None, metavar="N,N,...", help="the N values, e.g. 1,2,4,8 (instead of --n-max)")
    parser.add_argument(
        "--num-samples",
        type=int,
        default=None,
        metavar="M",
        help="responses sampled per prompt (default: the largest N); more lowers the variance of 'subsets'",
    )
    parser.add_argument(
        "--estimator",
        choices=["subsets", "first_n"],
        default="subsets",
        help="subsets: exact mean over all N-subsets of the M samples; first_n: best of the first N",
    )
    add_common_options(parser, max_new_tokens=48, batch_size=64)
    return parser


def main(argv: Sequence[str]) -> int:
    """Run ``rlhf-lit best-of-n`` with ``argv`` (the options after the command name); returns the exit status."""
    args = build_parser().parse_args(list(argv))
    ns = parse_n_list(args.n) if args.n is not None else powers_of_two(args.n_max)
    check_positive(num_samples=args.num_samples)
    if args.num_samples is not None and args.num_samples < ns[-1]:
        raise OptionError(f"--num-samples {args.num_samples} is below the largest N ({ns[-1]})")
    if args.pick_by == "reward_model" and args.reward_model is None:
        raise OptionError("--reward-model is required to pick by it (or give --pick-by judge with a --judge)")
    if args.pick_by == "judge" and args.judge is None:
        raise OptionError("--pick-by judge needs a --judge")
    if args.pairs_out is not None and ns[-1] < 2:
        raise OptionError(f"--pairs-out needs N >= 2 (the largest N is {ns[-1]}): a best and a worst of one sample")
    check_out(args.pairs_out, args.overwrite, "--pairs-out", lines=True)
    prompt_files = {"--prompts": [args.prompts], "--prompts-config": [args.prompts_config]}
    check_distinct_files({"--pairs-out": args.pairs_out, "--out": args.out}, prompt_files)
    sets, sampling, judge = prepare(args, [args.policy], reward_model=args.reward_model, tokenizer=args.tokenizer)
    prompts = sets[args.policy]
    m = args.num_samples or ns[-1]
    log.info("best-of-n: %d prompts x %d samples from %s, N in %s", len(prompts.prompts), m, args.policy, ns)
    result = best_of_n(
        args.policy,
        args.reward_model,
        prompts,
        ns,
        num_samples=m,
        judge=judge,
        estimator=args.estimator,
        sampling=sampling,
        pick_by=args.pick_by,
        **library_options(args),
    )
    if args.pairs_out is not None:
        result["pairs"] = write_pairs(args, prompts.prompts, result["samples"], m, ns[-1])
    result = command_result(
        "best-of-n",
        args,
        prompts,
        sampling,
        result,
        policy=args.policy,
        reward_model=args.reward_model,
        ns=ns,
        num_samples=m,
        estimator=args.estimator,
        pick_by=args.pick_by,
        pairs_out=args.pairs_out,
        tie_break="equal scores: the sample drawn first wins",
    )
    print(format_table(result["rows"]))
    write_result(args.out, result)
    return 0


def write_pairs(args, prompts: Sequence, samples: Sequence[dict], m: int, n: int) -> dict:
    """``--pairs-out``: the best and the worst of each prompt's first ``n`` samples by the picking score
    (:func:`~rlhf_lit.evaluation.best_of_n_pairs.best_worst_pairs`), written atomically as JSON Lines; returns
    what the result records of it, ``{"file", "n", "written", "tied", "empty"}``."""
    by_rm = args.pick_by == "reward_model"
    key, scored_by = ("rm", f"reward_model {args.reward_model}") if by_rm else ("judge", f"judge {args.judge}")
    records, tied, empty = best_worst_pairs(prompts, samples, m, n, key, scored_by)
    if not records:
        raise ValueError(
            f"--pairs-out {args.pairs_out}: the best and the worst tie, or one is empty, for every prompt; no pair "
            "to write"
        )
    write_jsonl_atomically(args.pairs_out, records)
    log.info(
        "wrote %s: %d pairs (the best and the worst of N = %d by the %s), %d prompts left out where they tie, "
        "%d where one is empty",
        args.pairs_out,
        len(records),
        n,
        args.pick_by.replace("_", " "),
        tied,
        empty,
    )
    return {"file": args.pairs_out, "n": n, "written": len(records), "tied": tied, "empty": empty}

"""``rlhf-lit best-of-n``: best-of-N sampling by a reward model, swept over N, with its analytic KL.

    rlhf-lit best-of-n --policy logs/offline/sft/model --reward-model logs/offline/reward_model/model \\
        --prompts prompts.txt --judge rlhf_lit.evaluation.judges:vader --n-max 64 --out bon.json

M responses are sampled once per prompt and every N of the sweep is evaluated on those same
samples (``--estimator subsets``: the exact expectation over all N-subsets; ``first_n``: nested
prefixes); per N it reports the pick's judge score, RM score, length and the analytic KL. The
method is described in :mod:`rlhf_lit.evaluation.best_of_n_sweep`.

This module is the argparse shell: it parses and checks the options, calls the library function
:func:`rlhf_lit.evaluation.best_of_n_sweep.best_of_n`, prints the table and writes the JSON.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from rlhf_lit.commands.options import (
    CommandParser,
    OptionError,
    add_common_options,
    check_positive,
    command_result,
    library_options,
    prepare,
    write_result,
)
from rlhf_lit.evaluation.best_of_n_sweep import best_of_n, format_table

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
        description="Sample M responses per prompt once, pick the best of N by a reward model for N in a sweep, "
        "and report the pick's judge score, RM score and length with the analytic KL log N - (N-1)/N.",
    )
    parser.add_argument("--policy", required=True, metavar="DIR", help="the model to sample from")
    parser.add_argument(
        "--reward-model",
        required=True,
        metavar="DIR",
        help="the reward model that picks the best (an ensemble directory: its members' mean)",
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
        **library_options(args),
    )
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
        tie_break="equal RM scores: the sample drawn first wins",
    )
    print(format_table(result["rows"]))
    write_result(args.out, result)
    return 0

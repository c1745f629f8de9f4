"""``rlhf-lit evaluate``: sample from a policy on prompts and measure judge, RM score, KL, distinct-n, length.

    rlhf-lit evaluate --policy logs/offline/ppo-full/model --prompts prompts.txt \\
        --reference logs/offline/sft/model --reward-model logs/offline/reward_model/model \\
        --judge rlhf_lit.evaluation.judges:vader --out eval.json

Every model is optional but the policy: without ``--reference`` there is no KL, without
``--reward-model`` no RM score, without ``--judge`` no judge score; length, the fraction of
responses that end with EOS and distinct-1/2 are always measured. KL is the per-response sum over
response tokens (EOS included) of ``logprob_policy - logprob_ref`` on the policy's own samples at
the sampling temperature: a Monte Carlo estimate of ``KL(policy || reference)`` of whole responses,
the quantity PPO's penalty controls.

This module is the argparse shell: it parses and checks the options, calls the library function
:func:`rlhf_lit.evaluation.policy_metrics.evaluate_policy`, prints the table and writes the JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from collections.abc import Sequence

from rlhf_lit.commands.options import (
    WRITTEN_BY_KEY,
    CommandParser,
    add_common_options,
    add_unfinished_option,
    check_positive,
    prepare,
    write_json,
)
from rlhf_lit.evaluation.policy_metrics import evaluate_policy, format_table

log = logging.getLogger(__name__)


def build_parser() -> CommandParser:
    """The options of ``rlhf-lit evaluate``."""
    parser = CommandParser(
        prog="rlhf-lit evaluate", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Sample responses from a policy on prompts; print judge score, RM score, KL to a reference, "
        "distinct-n and length, and write them (with every sample) as JSON.",
    )  # fmt: skip
    parser.add_argument("--policy", required=True, metavar="DIR", help="the model to evaluate (an export directory)")
    parser.add_argument("--reference", default=None, metavar="DIR", help="reference model for the KL (none: no KL)")
    parser.add_argument("--reward-model", default=None, metavar="DIR",
                        help="reward model to score responses, or an ensemble directory (its members' mean; none: no RM score)")
    add_unfinished_option(parser)
    parser.add_argument("--samples-per-prompt", type=int, default=1, help="responses per prompt")
    add_common_options(parser, max_new_tokens=48, batch_size=64)
    return parser


def main(argv: Sequence[str]) -> int:
    """Run ``rlhf-lit evaluate`` with ``argv`` (the options after the command name); returns the exit status."""
    args = build_parser().parse_args(list(argv))
    check_positive(samples_per_prompt=args.samples_per_prompt)
    prompts, sampling, judge = prepare(args, policy=args.policy, reference=args.reference,
                                       reward_model=args.reward_model, tokenizer=args.tokenizer)  # fmt: skip
    log.info("evaluate: %d prompts x %d samples from %s", len(prompts), args.samples_per_prompt, args.policy)
    result = evaluate_policy(
        args.policy, prompts, reference=args.reference, reward_model=args.reward_model, judge=judge,
        samples_per_prompt=args.samples_per_prompt, sampling=sampling, batch_size=args.batch_size, seed=args.seed,
        tokenizer=args.tokenizer, device=args.device, unfinished=args.unfinished, judge_reads=args.judge_reads,
        chat_template=args.chat_template,
    )  # fmt: skip
    result = {
        WRITTEN_BY_KEY: "rlhf-lit evaluate",
        "config": {
            "policy": args.policy, "reference": args.reference, "reward_model": args.reward_model,
            "judge": args.judge, "prompts": args.prompts, "num_prompts": len(prompts),
            "samples_per_prompt": args.samples_per_prompt, "sampling": dataclasses.asdict(sampling),
            "unfinished": args.unfinished, "judge_reads": args.judge_reads, "chat_template": args.chat_template,
            "batch_size": args.batch_size, "seed": args.seed, "tokenizer": args.tokenizer, "device": args.device,
        },  # fmt: skip
        **result,
    }
    print(format_table(result))
    if args.out is not None:
        write_json(args.out, result)
        log.info("wrote %s", args.out)
    return 0

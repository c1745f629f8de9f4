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

Several policies on one prompt file (a run's checkpoints, one run per seed)::

    rlhf-lit evaluate --policy runs/exp/seed_1/ppo/model runs/exp/seed_2/ppo/model \
        --reference logs/offline/sft/model --prompts prompts.txt --judge rlhf_lit.evaluation.judges:vader \
        --out eval/

Each is evaluated on the same prompts with the same ``--seed`` and settings; the table has one row
per policy and ``--out`` is a directory holding one result per policy, ``<name>.json``, where
``<name>`` is the shortest tail of the policy's path that tells the policies apart, its parts joined
by ``_`` (``seed_1_ppo_model.json``, ``seed_2_ppo_model.json``): each one exactly what a one-policy
run writes, so ``rlhf-lit frontier --eval`` reads it. None is written over without ``--overwrite``.

This module is the argparse shell: it parses and checks the options, calls the library function
:func:`rlhf_lit.evaluation.policy_metrics.evaluate_policy`, prints the table and writes the JSON.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from pathlib import PurePath

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
from rlhf_lit.evaluation.policy_metrics import evaluate_policy, format_comparison, format_table

log = logging.getLogger(__name__)


def build_parser() -> CommandParser:
    """The options of ``rlhf-lit evaluate``."""
    parser = CommandParser(
        prog="rlhf-lit evaluate",
        description="Sample responses from a policy on prompts; print judge score, RM score, KL to a reference, "
        "distinct-n and length, and write them (with every sample) as JSON.",
    )
    parser.add_argument(
        "--policy",
        required=True,
        nargs="+",
        metavar="DIR",
        help="the model to evaluate (an export directory), or several: each on the same prompts and "
        "seed, one table row each, and --out names a directory of one <name>.json per policy",
    )
    parser.add_argument("--reference", default=None, metavar="DIR", help="reference model for the KL (none: no KL)")
    parser.add_argument(
        "--reward-model",
        default=None,
        metavar="DIR",
        help="reward model to score responses, or an ensemble directory (its members' mean; none: no RM score)",
    )
    parser.add_argument("--samples-per-prompt", type=int, default=1, help="responses per prompt")
    add_common_options(parser, max_new_tokens=48, batch_size=64)
    return parser


def result_names(policies: Sequence[str]) -> list[str]:
    """One file name stem per policy: the shortest tail of its path telling them apart, parts joined by ``_``."""
    parts = [_parts(p) for p in policies]
    for k in range(1, max(len(p) for p in parts) + 1):
        names = ["_".join(p[-k:]).strip("/\\").replace(os.sep, "_") or "policy" for p in parts]
        if len(set(names)) == len(names):
            return names
    return [f"policy_{i}" for i in range(len(policies))]  # not reached: distinct paths have distinct tails


def _parts(policy: str) -> tuple[str, ...]:
    return PurePath(os.path.normpath(os.path.abspath(os.path.expanduser(policy)))).parts


def out_files(out: str | None, policies: Sequence[str]) -> list[str | None]:
    """Where each policy's result goes: ``--out`` itself for one policy, ``--out/<name>.json`` for several."""
    if len(set(map(_parts, policies))) < len(policies):
        raise OptionError("--policy: the same directory is given twice")
    if len(policies) == 1 or out is None:
        return [out] * len(policies)
    if os.path.exists(out) and not os.path.isdir(out):
        raise OptionError(
            f"--out {out} is a file; with several --policy it names a directory (one <name>.json per policy)"
        )
    return [os.path.join(out, f"{name}.json") for name in result_names(policies)]


def main(argv: Sequence[str]) -> int:
    """Run ``rlhf-lit evaluate`` with ``argv`` (the options after the command name); returns the exit status."""
    args = build_parser().parse_args(list(argv))
    check_positive(samples_per_prompt=args.samples_per_prompt)
    policies = args.policy
    outs = out_files(args.out, policies)
    prompts, sampling, judge = prepare(
        args, policies, reference=args.reference, reward_model=args.reward_model, tokenizer=args.tokenizer, outs=outs
    )
    results = {}
    for policy, out in zip(policies, outs):
        results[policy] = _evaluate(args, policy, prompts[policy], sampling, judge)
        if len(policies) == 1:
            print(format_table(results[policy]))
        write_result(out, results[policy])  # the writer makes the folder of several policies' results
    if len(policies) > 1:
        print(format_comparison(results))
        if args.out is not None:
            print("wrote " + ", ".join(outs))
    return 0


def _evaluate(args: argparse.Namespace, policy: str, prompts, sampling, judge) -> dict:
    """The result of one policy, as ``--out`` holds it."""
    log.info("evaluate: %d prompts x %d samples from %s", len(prompts.prompts), args.samples_per_prompt, policy)
    result = evaluate_policy(
        policy,
        prompts,
        reference=args.reference,
        reward_model=args.reward_model,
        judge=judge,
        samples_per_prompt=args.samples_per_prompt,
        sampling=sampling,
        **library_options(args),
    )
    return command_result(
        "evaluate",
        args,
        prompts,
        sampling,
        result,
        policy=policy,
        reference=args.reference,
        reward_model=args.reward_model,
        samples_per_prompt=args.samples_per_prompt,
    )

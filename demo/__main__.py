"""``python -m demo {split,preferences,evaluate,report,pipeline,seeds,rm-study,guard,iterate,diversity}``: the offline demo's commands."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import get_args

from demo.labeling import Labeler, Pairing
from demo.plan import ASSETS
from demo.story_prompts import RANGES
from rlhf_lit.evaluation.judges import DEFAULT_JUDGE
from rlhf_lit.models.precision import SamplingPrecision
from rlhf_lit.models.token_draw import DRAWS

DEFAULT_PARAGRAPHS = str(ASSETS / "data" / "tinystories" / "val.txt")


def _add_prompt_args(p: argparse.ArgumentParser, stage: str) -> None:
    start, count = RANGES[stage]
    p.add_argument(
        "--paragraphs", default=DEFAULT_PARAGRAPHS, help="blank-line separated stories (TinyStories val.txt)"
    )
    p.add_argument("--start", type=int, default=start, help="first paragraph index of the prompts")
    p.add_argument("--count", type=int, default=count, help="number of paragraphs (prompts)")
    p.add_argument("--num-words", type=int, default=8, help="opening words of a paragraph used as prompt")
    p.add_argument("--judge", default=DEFAULT_JUDGE, help="judge spec 'module:function'")
    p.add_argument("--tokenizer", default=None, help="tokenizer location when not beside the model")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    p.add_argument("--max-new-tokens", type=int, default=48, help="most tokens per completion")
    p.add_argument(
        "--draw",
        choices=DRAWS,
        default="multinomial",
        help="how each token is drawn (rlhf_lit.models.token_draw: the same distribution, other samples of a seed)",
    )
    p.add_argument("--batch-size", type=int, default=64, help="completions per generate call")
    p.add_argument("--seed", type=int, default=0, help="sampling (and labelling) seed")


def _sampling(args: argparse.Namespace):
    from rlhf_lit.models.generation import SamplingConfig

    return SamplingConfig(temperature=args.temperature, max_new_tokens=args.max_new_tokens, draw=args.draw)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of all subcommands."""
    fmt = argparse.ArgumentDefaultsHelpFormatter
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__, formatter_class=fmt)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "split", formatter_class=fmt, help="write the disjoint paragraph ranges as sft/reward_model/ppo/eval.txt"
    )
    p.add_argument("--paragraphs", default=DEFAULT_PARAGRAPHS, help="blank-line separated stories")
    p.add_argument("--out-dir", required=True, help="directory for the .txt files")

    p = sub.add_parser(
        "preferences",
        formatter_class=fmt,
        help="sample K completions per prompt, judge-labelled pairs or rankings to JSONL",
    )
    p.add_argument("--model", required=True, help="SFT model directory to sample from")
    p.add_argument("--out", required=True, help="preference JSONL to write")
    _add_prompt_args(p, "reward_model")
    p.add_argument("--samples-per-prompt", type=int, default=2, help="K >= 2 completions per prompt")
    p.add_argument(
        "--labeler",
        choices=get_args(Labeler),
        default="argmax",
        help="argmax: higher score wins, ties dropped; bradley_terry: noisy labels",
    )
    p.add_argument(
        "--pairing",
        choices=get_args(Pairing),
        default="best_worst",
        help="what the K samples of a prompt become: one best-vs-worst pair, all K(K-1)/2 "
        "pairs, or one ranking record of all K (read with format: rankings)",
    )
    p.add_argument(
        "--bt-temperature",
        type=float,
        default=None,
        help="Bradley-Terry temperature, bradley_terry only (None there means 0.25)",
    )
    p.add_argument(
        "--rankings-out",
        default=None,
        help="also write one ranking record per prompt of the same samples here (format: rankings)",
    )
    p.add_argument(
        "--prompts",
        default=None,
        help="a prompts file (text lines, or JSONL of strings or conversations) instead of the paragraph range",
    )
    p.add_argument(
        "--precision",
        choices=get_args(SamplingPrecision),
        default="32-true",
        help="how the model samples: in float32, or under bf16 autocast (faster on a CPU with bf16 "
        "instructions, amx_bf16 or avx512_bf16, slower on one without); the judge is unchanged",
    )

    p = sub.add_parser("evaluate", formatter_class=fmt, help="judge score, KL to the reference, distinct-n, length")
    p.add_argument("--policy", required=True, help="policy directory to evaluate")
    p.add_argument("--reference", required=True, help="reference (SFT) directory for the KL")
    p.add_argument("--out", default=None, help="JSON file for the result")
    _add_prompt_args(p, "eval")
    p.add_argument("--samples-per-prompt", type=int, default=1, help="completions per prompt")

    p = sub.add_parser("report", formatter_class=fmt, help="PNG plots of a PPO TensorBoard run and a markdown summary")
    p.add_argument("--run", required=True, help="TensorBoard run dir (the version_N folder)")
    p.add_argument("--out-dir", required=True, help="where the PNGs and report.md go")
    p.add_argument("--label", default="PPO", help="legend label of --run")
    p.add_argument("--compare", default=None, help="a second run drawn beside it (e.g. KL=0)")
    p.add_argument("--compare-label", default="KL=0", help="legend label of --compare")
    p.add_argument("--before", default=None, help="evaluate JSON of the SFT model")
    p.add_argument("--after", default=None, help="evaluate JSON of the PPO policy")
    p.add_argument("--num-examples", type=int, default=8, help="sample generations in the table")

    # Listed for --help only: main() hands `pipeline ...` to demo.pipeline before parsing.
    sub.add_parser(
        "pipeline", add_help=False, help="run every stage end to end (options: python -m demo.pipeline --help)"
    )
    sub.add_parser(
        "seeds",
        add_help=False,
        help="rerun PPO variants and the DPO sweep of a finished demo on several seeds "
        "(options: python -m demo seeds --help)",
    )
    sub.add_parser(
        "rm-study",
        add_help=False,
        help="RM held-out accuracy from best-vs-worst pairs, rankings and all pairs of the same "
        "judged samples, on several seeds (options: python -m demo rm-study --help)",
    )
    sub.add_parser(
        "guard",
        add_help=False,
        help="over-optimisation of a weaker proxy RM, watched by the over-optimisation guard "
        "(options: python -m demo guard --help)",
    )
    sub.add_parser(
        "iterate",
        add_help=False,
        help="iterated RLHF (rlhf-lit iterate) against one reward model at equal policy compute, on several "
        "seeds (options: python -m demo iterate --help)",
    )
    sub.add_parser(
        "diversity",
        add_help=False,
        help="why held-out distinct-2 falls: the RM's and the judge's taste for repetition, best-of-N by each, "
        "distinct-2 within and across responses, entropy, on a demo and its seeds study "
        "(options: python -m demo diversity --help)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; returns the exit status. A damaged file it reads back (a model, a
    checkpoint, a cached result of an earlier run) ends it with one line naming the file, exit 1."""
    from rlhf_lit.integrity import DamagedFile
    from rlhf_lit.sources import DamagedSource

    try:
        return _run(sys.argv[1:] if argv is None else list(argv))
    except (DamagedFile, DamagedSource) as error:
        print(f"error: {error} (delete or restore it, then run the command again)", file=sys.stderr)
        return 1


def _run(argv: list[str]) -> int:
    """The subcommand ``argv[0]`` with its arguments (:func:`main`)."""
    if argv[:1] == ["pipeline"]:
        # Handed over before parsing: argparse cannot pass options such as --help through unparsed.
        from demo.pipeline import main as pipeline_main

        return pipeline_main(argv[1:])
    if argv[:1] == ["seeds"]:
        from demo.seeds import main as seeds_main

        return seeds_main(argv[1:])
    if argv[:1] == ["rm-study"]:
        from demo.rm_study import main as rm_study_main

        return rm_study_main(argv[1:])
    if argv[:1] == ["guard"]:
        from demo.guard_study import main as guard_main

        return guard_main(argv[1:])
    if argv[:1] == ["iterate"]:
        from demo.iterate_study import main as iterate_main

        return iterate_main(argv[1:])
    if argv[:1] == ["diversity"]:
        from demo.diversity_study import main as diversity_main

        return diversity_main(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "split":
        from demo.story_prompts import write_splits

        for stage, path in write_splits(args.paragraphs, args.out_dir).items():
            start, count = RANGES[stage]
            print(f"{stage}: paragraphs [{start}, {start + count}) -> {path}")
    elif args.command == "preferences":
        from demo.preferences import make_preferences

        stats = make_preferences(
            args.model,
            args.paragraphs,
            args.out,
            start=args.start,
            count=args.count,
            num_words=args.num_words,
            samples_per_prompt=args.samples_per_prompt,
            labeler=args.labeler,
            pairing=args.pairing,
            bt_temperature=args.bt_temperature,
            judge=args.judge,
            sampling=_sampling(args),
            batch_size=args.batch_size,
            seed=args.seed,
            tokenizer=args.tokenizer,
            device=args.device,
            rankings_out=args.rankings_out,
            prompts_file=args.prompts,
            precision=args.precision,
        )
        print(json.dumps(stats, indent=1))
    elif args.command == "evaluate":
        from demo.held_out_eval import evaluate, format_table

        result = evaluate(
            args.policy,
            args.reference,
            args.paragraphs,
            start=args.start,
            count=args.count,
            num_words=args.num_words,
            samples_per_prompt=args.samples_per_prompt,
            judge=args.judge,
            sampling=_sampling(args),
            batch_size=args.batch_size,
            seed=args.seed,
            tokenizer=args.tokenizer,
            device=args.device,
            out=args.out,
        )
        print(format_table(result))
    elif args.command == "report":
        from demo.report import write_report

        path = write_report(
            args.run,
            args.out_dir,
            label=args.label,
            compare=args.compare,
            compare_label=args.compare_label,
            before=args.before,
            after=args.after,
            num_examples=args.num_examples,
        )
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

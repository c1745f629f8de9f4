"""The argparse shell of ``rlhf-lit evaluate`` and ``rlhf-lit best-of-n``: parser, options, checks, ``--out``.

Errors read as the rest of rlhf-lit's: a bad option value is an :class:`OptionError` (one line
``rlhf-lit: error: ...``, exit status 2), checked before any model is loaded (:func:`prepare`).
The work itself is the evaluation library's (:mod:`rlhf_lit.evaluation`); the result is written
by the rule of :mod:`rlhf_lit.artifacts`: every JSON a command writes carries ``"written_by":
"rlhf-lit <command>"`` (:data:`WRITTEN_BY_KEY`), ``--overwrite`` replaces only such a file, and
the write is atomic.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from typing import get_args

# WRITTEN_BY_KEY: the commands stamp their JSON with it; write_json: how each writes its result (atomically)
from rlhf_lit.artifacts import WRITTEN_BY_KEY, json_file_state, jsonl_file_state  # noqa: F401
from rlhf_lit.artifacts import write_json_atomically as write_json  # noqa: F401

# OptionError: every command's bad option value (exit status 2), raised by these checks too
from rlhf_lit.commands.option_checks import OptionError, check_distinct_files, check_seed_and_device
from rlhf_lit.evaluation import samples
from rlhf_lit.integrity import DamagedFile, check_json_file, check_jsonl_file

log = logging.getLogger(__name__)

OWNER_PREFIX = "rlhf-lit "
"""What the ``written_by`` of a file rlhf-lit's commands wrote starts with."""


class CommandParser(argparse.ArgumentParser):
    """An argparse parser whose errors read like the rest of rlhf-lit: one ``rlhf-lit: error:`` line, exit 2;
    its ``--help`` shows each option's default."""

    def __init__(self, **kwargs) -> None:
        super().__init__(formatter_class=argparse.ArgumentDefaultsHelpFormatter, **kwargs)

    def error(self, message: str):
        """Print ``rlhf-lit: error: <message>`` and where the options are listed; exit 2."""
        self.exit(2, f"rlhf-lit: error: {message}\n(`{self.prog} --help` lists the options)\n")


LIBRARY_OPTIONS = (
    "batch_size",
    "seed",
    "tokenizer",
    "device",
    "unfinished",
    "judge_reads",
    "chat_template",
    "precision",
)
"""The options both commands pass to the library as they are, and record in their result's ``config``."""


def library_options(args: argparse.Namespace) -> dict:
    """The values of :data:`LIBRARY_OPTIONS`, by the library's argument names."""
    return {name: getattr(args, name) for name in LIBRARY_OPTIONS}


def command_result(command: str, args: argparse.Namespace, prompts, sampling, result: dict, **config) -> dict:
    """What ``rlhf-lit <command>`` writes: the ``written_by`` stamp, the ``config`` (the command's own entries
    ``config``, then the judge, the prompts (``prompts``: the set read, :func:`read_prompt_sets`) and their
    source, the sampling and :func:`library_options`) and ``result``."""
    shared = {
        "judge": args.judge,
        "prompts": args.prompts or args.prompts_config,
        "prompt_source": dataclasses.asdict(prompt_source(args)),
        "num_prompts": len(prompts.prompts),
    }
    return {
        WRITTEN_BY_KEY: f"rlhf-lit {command}",
        "config": {**config, **shared, "sampling": dataclasses.asdict(sampling), **library_options(args)},
        **result,
    }


def write_result(out: str | None, result: dict) -> None:
    """Write ``result`` to ``out`` (checked by :func:`check_out` before any work) and log it; nothing without ``out``."""
    if out is not None:
        write_json(out, result)
        log.info("wrote %s", out)


def add_common_options(parser: argparse.ArgumentParser, *, max_new_tokens: int, batch_size: int) -> None:
    """Options both commands take: how the reward model reads a cut response, prompts, tokenizer,
    sampling (and its precision), seed, device, output."""
    from rlhf_lit.data.rendering import TEMPLATE_CHOICES
    from rlhf_lit.evaluation.judges import DEFAULT_JUDGE, JudgeReads
    from rlhf_lit.models.precision import SamplingPrecision
    from rlhf_lit.models.scoring import UnfinishedScoring
    from rlhf_lit.models.token_draw import DRAWS

    parser.add_argument(
        "--unfinished",
        choices=get_args(UnfinishedScoring),
        default="as_sampled",
        help="how the reward model reads a response cut at --max-new-tokens: as sampled, or with EOS "
        "appended (as rlhf-lit's RM stage trained it; PPO's reward.unfinished)",
    )
    add_prompt_options(parser)
    parser.add_argument(
        "--chat-template",
        default="auto",
        metavar="{" + ",".join(TEMPLATE_CHOICES) + "}",
        help="render string prompts as one user turn with the policy's chat template, and read HH-RLHF transcripts "
        "as conversations: auto (when its tokenizer has one, as the data modules' chat_template and hh_render), "
        "always, never (chat_template, raw: deprecated aliases of always, never, removed in 0.3.0); "
        "conversations always are",
    )
    parser.add_argument(
        "--judge",
        default=None,
        metavar="MODULE:FUNCTION|DIR",
        help=f"judge scoring each response text, higher is better (e.g. {DEFAULT_JUDGE}), or the directory of a "
        "reward-model export (a gold reward model: it scores each prompt as the policy read it with its "
        "response); none by default",
    )
    parser.add_argument(
        "--judge-reads",
        choices=get_args(JudgeReads),
        default="response",
        help="what a MODULE:FUNCTION --judge reads: the response, or the prompt as the policy read it "
        "(rendered) + the response",
    )
    parser.add_argument("--tokenizer", default=None, metavar="DIR", help="tokenizer when not beside the policy")
    recorded = "default: as the policy sampled in training when its export records it, else"
    parser.add_argument("--max-new-tokens", type=int, help=f"most tokens per response ({recorded} {max_new_tokens})")
    parser.add_argument(
        "--temperature", type=float, help=f"sampling temperature, KL logprobs use it too ({recorded} 1.0)"
    )
    parser.add_argument("--top-k", type=int, help=f"sample among the k most likely tokens; 0 = off ({recorded} 0)")
    parser.add_argument("--top-p", type=float, help=f"nucleus sampling threshold; 1.0 = off ({recorded} 1.0)")
    parser.add_argument(
        "--draw",
        choices=DRAWS,
        help="how each token is drawn from its distribution: multinomial (as transformers' generate) or inverse_cdf "
        f"(one uniform per row: the same distribution, other samples of a seed, cheaper on a CPU) ({recorded} "
        "multinomial)",
    )
    parser.add_argument(
        "--precision",
        choices=get_args(SamplingPrecision),
        default="32-true",
        help="how the policy samples: in float32, or under bf16 autocast (trainer.precision's words; faster on a "
        "GPU or a CPU with bf16 instructions, amx_bf16 or avx512_bf16, slower on a CPU without); the KL and the reward-model "
        "and judge scores stay float32",
    )
    parser.set_defaults(sampling_fallback={"max_new_tokens": max_new_tokens, **SAMPLING_FALLBACK})
    parser.add_argument(
        "--batch-size",
        type=int,
        default=batch_size,
        help="responses per generate call (changing it changes the samples of a seed)",
    )
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    parser.add_argument("--device", default=None, help="torch device, e.g. cpu or cuda (default: cuda if available)")
    add_out_options(parser, "JSON file for the result")


def add_prompt_options(parser: argparse.ArgumentParser) -> None:
    """Where the prompts come from: a :class:`~rlhf_lit.data.prompt_source.PromptSource`, read as ``fit`` reads data."""
    from rlhf_lit.data.prompt_source import CONFIG_SPLITS, PromptSourceFormat

    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--prompts",
        metavar="FILE|DATASET",
        help="prompts: a file (.jsonl / .json records in any format the data modules read, optionally .gz; "
        ".txt: one prompt per line) or a Hugging Face hub dataset (its split: --prompt-split)",
    )
    which.add_argument(
        "--prompts-config",
        metavar="FIT_CONFIG.yaml",
        help="the prompts a fit config's data module holds out (--prompt-split val, the default) or trains on "
        "(train): the same seeded split as the fit",
    )
    parser.add_argument(
        "--prompt-split",
        default=None,
        metavar="SPLIT",
        help=f"a hub dataset's split (default train); with --prompts-config one of {', '.join(CONFIG_SPLITS)}",
    )
    parser.add_argument("--prompt-subset", default=None, metavar="NAME", help="a hub dataset's subset")
    parser.add_argument(
        "--prompt-format",
        choices=get_args(PromptSourceFormat),
        default="auto",
        help="the record format (auto: detected as the data modules detect it; .txt files as lines); lines: one "
        "prompt per line; jsonl: JSON lines whatever the file's name",
    )
    parser.add_argument(
        "--prompt-field",
        default=None,
        metavar="NAME",
        help="the column holding the prompt (a string, or a list of messages ending with the user's turn)",
    )
    parser.add_argument(
        "--prompt-seed",
        type=int,
        default=None,
        metavar="SEED",
        help="with --prompts-config: the --seed_everything the fit ran with (default: the config's seed_everything)",
    )
    parser.add_argument("--max-prompts", type=int, default=None, metavar="K", help="use only the first K prompts")


def prompt_source(args: argparse.Namespace):
    """The :class:`~rlhf_lit.data.prompt_source.PromptSource` the prompt options name (:class:`OptionError` otherwise)."""
    from rlhf_lit.data.prompt_source import PromptSource

    try:
        return PromptSource(
            path=args.prompts,
            config=args.prompts_config,
            split=args.prompt_split,
            subset=args.prompt_subset,
            format=args.prompt_format,
            field=args.prompt_field,
            seed=args.prompt_seed,
            max_prompts=args.max_prompts,
        )
    except ValueError as error:
        option = "--prompts" if args.prompts is not None else "--prompts-config"
        raise OptionError(f"{option} {args.prompts or args.prompts_config}: {error}") from None


def read_prompt_sets(args: argparse.Namespace, policies: list[str]) -> dict:
    """The prompts each policy reads (a :class:`~rlhf_lit.data.prompt_source.PromptSet` per policy, read for its
    tokenizer, or ``--tokenizer``: how HH transcripts read follows it), before any weights load."""
    from rlhf_lit.data.prompt_source import read_prompt_source
    from rlhf_lit.tokenizer import load_tokenizer

    source, read, sets = prompt_source(args), {}, {}
    option = "--prompts" if args.prompts is not None else "--prompts-config"
    for policy in policies:
        where = args.tokenizer or policy
        if where not in read:
            tokenizer = load_tokenizer(where, padding_side="left", what="--tokenizer" if args.tokenizer else "--policy")
            read[where] = dataclasses.replace(read_prompt_source(source, tokenizer, args.chat_template), where=option)
        sets[policy] = read[where]
    return sets


def add_out_options(parser: argparse.ArgumentParser, what: str) -> None:
    """``--out FILE.json`` (``what`` it holds, in its help) and ``--overwrite``, checked by :func:`check_out`."""
    parser.add_argument(
        "--out", default=None, metavar="FILE.json", help=f"{what} (never replaces a file rlhf-lit did not write)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace --out if an earlier rlhf-lit run wrote it")


SAMPLING_FALLBACK = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "draw": "multinomial"}
"""The sampling options' values when neither the command line nor the policy's export gives one
(``max_new_tokens``: the command's own, :func:`add_common_options`)."""


def recorded_sampling(policy: str) -> dict:
    """How the export ``policy`` sampled in training (its marker's ``sampling`` entry, written by PPO:
    :data:`rlhf_lit.stages.export.SAMPLING_KEY`); empty when it records none (a hub name, an SFT or DPO export)."""
    from rlhf_lit.artifacts import EXPORT_MARKER
    from rlhf_lit.stages.export import SAMPLING_KEY

    marker = os.path.join(os.path.expanduser(policy), EXPORT_MARKER)
    if not os.path.isfile(marker):
        return {}
    try:
        recorded = check_json_file(marker).get(SAMPLING_KEY)
    except (DamagedFile, OSError) as damage:
        raise OptionError(f"--policy {policy}: {damage}") from None
    return recorded if isinstance(recorded, dict) else {}


def resolve_sampling(args: argparse.Namespace, policies: list[str]) -> None:
    """Fill each sampling option left unset on the command line: as the ``policies`` sampled in training
    (:func:`recorded_sampling`; one INFO line says so), else :data:`SAMPLING_FALLBACK`. Policies that trained
    with different values of an unset option are refused: the table would compare them at one setting."""
    taken, recorded = {}, {p: recorded_sampling(p) for p in policies}
    for key, fallback in args.sampling_fallback.items():
        if getattr(args, key) is not None:
            continue
        values = {p: r[key] for p, r in recorded.items() if key in r}
        if len(set(map(repr, values.values()))) > 1:
            seen = ", ".join(f"{v} ({p})" for p, v in values.items())
            raise OptionError(
                f"--{key.replace('_', '-')}: the policies sampled with different values in training ({seen}); "
                "give it on the command line"
            )
        setattr(args, key, next(iter(values.values())) if values else fallback)
        if values:
            taken[key] = getattr(args, key)
    if taken:
        said = ", ".join(f"{k} {v}" for k, v in taken.items())
        log.info(
            "sampling as the policy did in training (its rlhf_lit_export.json): %s; the command line overrides", said
        )


def sampling_from(args: argparse.Namespace):
    """The :class:`~rlhf_lit.models.generation.SamplingConfig` of the options (bad values: :class:`OptionError`)."""
    from rlhf_lit.models.generation import SamplingConfig

    try:
        return SamplingConfig(
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            draw=args.draw,
        )
    except ValueError as e:
        raise OptionError(str(e).replace("sampling.", "--").replace("_", "-")) from None


def check_positive(**values: int | None) -> None:
    """Raise :class:`OptionError` for an option (given as ``name=value``, ``_`` for ``-``) below 1."""
    try:
        samples.check_positive(**values)  # the library's rule and message
    except ValueError as error:
        raise OptionError(str(error)) from None


def check_out(path: str | None, overwrite: bool, option: str = "--out", lines: bool = False) -> None:
    """Refuse an ``--out`` (or another output ``option``) that would destroy a file (before any work): raises
    :class:`OptionError`.

    An existing file is replaced only with ``overwrite`` and only if an rlhf-lit command wrote it
    (its JSON carries the ``written_by`` marker; with ``lines``, a JSON Lines file, its first record); a
    directory is never replaced.
    """
    state_of, check = (jsonl_file_state, check_jsonl_file) if lines else (json_file_state, check_json_file)
    state = "absent" if path is None else state_of(path, OWNER_PREFIX)
    if state == "absent":
        return
    if state == "directory":
        raise OptionError(f"{option} {path} is a directory; give a {'JSON Lines' if lines else 'JSON'} file name")
    if not overwrite:
        raise OptionError(f"{option} {path} exists; pass --overwrite to replace it, or choose another file")
    if state != "owned":
        try:
            check(path)
        except (DamagedFile, OSError) as damage:  # cut short, say, so its writer cannot be told: kept all the same
            raise OptionError(
                f"{option} {damage}, so it cannot be told as rlhf-lit's output; it is not replaced even "
                "with --overwrite: delete it or choose another file"
            ) from None
        raise OptionError(
            f"{option} {path} exists and was not written by rlhf-lit; it is not replaced even with --overwrite"
        )


def check_sources(**paths: str | None) -> None:
    """Refuse a local model path that does not exist, is not a directory, or holds a damaged file
    (``name=path``; hub names pass): before any model is loaded."""
    from rlhf_lit.models.reward_ensemble import is_reward_ensemble, member_paths
    from rlhf_lit.sources import _looks_local, check_local_source, check_source_files

    for name, path in paths.items():
        if path is None:
            continue
        option = f"--{name.replace('_', '-')}"
        expanded = os.path.expanduser(path)
        if os.path.exists(expanded) and not os.path.isdir(expanded):
            raise ValueError(f"{option} {path}: not a directory (give the model directory)")
        if not os.path.exists(expanded) and _looks_local(path):
            raise ValueError(f"{option} {path}: no such directory")
        if os.path.isdir(expanded) and is_reward_ensemble(expanded):  # its manifest, then each member
            check_local_source(path, option)
            for member in member_paths(expanded):
                if os.path.isdir(member):  # a missing member is named where the ensemble is loaded
                    check_source_files(member, f"{option} member")
        elif os.path.isdir(expanded) and (name == "tokenizer" or os.path.isfile(os.path.join(expanded, "config.json"))):
            check_source_files(path, option, "tokenizer" if name == "tokenizer" else "model")


def chat_template_option(value: str) -> str:
    """``--chat-template`` in its canonical spelling (an alias mapped); :class:`OptionError` naming it otherwise."""
    from rlhf_lit.data.rendering import template_choice

    try:
        return template_choice(value, "--chat-template")
    except ValueError as error:
        raise OptionError(str(error)) from None


def prepare(
    args: argparse.Namespace, policies: list[str], outs: list[str | None] | None = None, **sources: str | None
) -> tuple[dict, object, object | None]:
    """Every check a command makes before loading a model's weights: ``(prompts, sampling, judge or None)``,
    ``prompts`` the set each of ``policies`` reads (:func:`read_prompt_sets`).

    ``outs``: the files the command will write (default: ``--out``), each checked by :func:`check_out`;
    ``sources``: the model options (``name=path``) checked by :func:`check_sources` with every policy.
    """
    from rlhf_lit.evaluation.judges import load_judge

    check_positive(batch_size=args.batch_size, max_prompts=args.max_prompts)
    args.chat_template = chat_template_option(args.chat_template)
    resolve_sampling(args, policies)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    check_seed_and_device(args.seed, args.device)
    sampling = sampling_from(args)
    for out in [args.out] if outs is None else outs:
        check_out(out, args.overwrite)
    check_distinct_files({"--out": args.out}, {"--prompts": [args.prompts], "--prompts-config": [args.prompts_config]})
    check_sources(**sources)
    for policy in policies:
        check_sources(policy=policy)
    prompts = read_prompt_sets(args, policies)
    judge = load_judge(args.judge, device=args.device, option="--judge") if args.judge else None
    return prompts, sampling, judge

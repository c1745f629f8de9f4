"""``rlhf-lit iterate``: iterated RLHF. Label the policy's own samples, refit the reward model, run PPO again.

    rlhf-lit iterate --config configs/offline/iterate.yaml

For t = 1..T (the config: :mod:`rlhf_lit.commands.iterate_config`): sample K responses per prompt from the
current policy on fresh prompts, label them (a judge, a held-out reward model, or a labels file a person
wrote), add them to the reward model's data (``all`` so far or the ``latest``), refit the reward model (from
the ``previous`` one or the ``sft`` model), then run PPO (``restart`` from SFT, the default, or ``continue``
from the current policy); or, with ``policy: bonbon``, fit BoNBoN on each prompt's best and worst sample from
the current policy, its reference too (online best-of-N distillation). Each fit is an ordinary ``rlhf-lit fit`` of the stage config a user writes, run
with ``--run_dir <run_dir>/iter_<t>`` in a process of its own (the loop is an orchestrator like ``rlhf-lit
seeds``: a fit's memory, threads and global state end with its process, a kill of the loop cannot leave a
stage half-built in it, and commands sit below the CLI, which they never import). The steps of an iteration
are :mod:`rlhf_lit.commands.iterate_steps`.

Resumable: run the same command again after a kill. Each step's output is written atomically and checked
when read back; a finished stage (its export marker written, its files intact) is skipped, anything else is
redone. ``<run_dir>/iterate.json`` keeps the config: a rerun with another config is refused (more
``iterations`` extend the run).

Per iteration the summary (printed, ``<run_dir>/summary.json`` and ``summary.csv``) has the reward model's
pairwise accuracy on the iteration's held-out labels before and after the refit (the policy's new samples:
the distribution shift made visible), and the new policy on the held-out prompts: the gold score (the
labeller's, or ``evaluation.judge``), the proxy score (the iteration's reward model) and the KL to the SFT
model; row 0 is the SFT model. Everything is checked before the first fit: the config, the models, the
prompts, the judge, every labels file already written.
"""

from __future__ import annotations

import csv
import io
import os
import time
from collections.abc import Sequence
from dataclasses import asdict

from rlhf_lit.artifacts import WRITTEN_BY_KEY, write_json_atomically, write_text_atomically
from rlhf_lit.child_runs import run_rlhf_lit, stop_on_signals
from rlhf_lit.commands import iterate_steps as steps
from rlhf_lit.commands.iterate_config import IterateConfig, PromptsGroup, read_config
from rlhf_lit.commands.iterate_files import ROW_FIELDS, check_snapshot_fields, checked_row
from rlhf_lit.commands.iterate_labels import JudgeScorer, Scorer, as_policy_read, read_labels_file
from rlhf_lit.commands.options import CommandParser, OptionError
from rlhf_lit.commands.seeds_command import model_class_path
from rlhf_lit.integrity import DamagedFile, check_json_file

#: iterate.json's record of whether the loop's labels hold chats (the policy reads string prompts in its template).
CHAT_RENDERED_KEY = "chat_rendered"

COLUMNS = tuple(ROW_FIELDS)
"""The summary's columns, one row per iteration (0: the SFT model); each one's kind: ``ROW_FIELDS``."""
STAGE_CLASSES = {"reward_model": "RewardModelModule", "ppo": "PPOModule", "bonbon": "BoNBoNModule"}
STAGE_NAMES = {"ppo": "PPO", "bonbon": "BoNBoN"}

run_fit: steps.FitRunner = run_rlhf_lit
"""How each stage's ``rlhf-lit fit`` runs (a child process); the tests swap in an in-process runner."""


def build_parser() -> CommandParser:
    """The options of ``rlhf-lit iterate``."""
    parser = CommandParser(
        prog="rlhf-lit iterate",
        description="Iterated RLHF: per iteration sample the policy on fresh prompts, label the samples, refit the "
        "reward model, run PPO (or, with policy: bonbon, fit BoNBoN on the best and worst of the samples); each fit "
        "an ordinary `rlhf-lit fit` under RUN_DIR/iter_<t>. Resumable: run it again.",
    )
    parser.add_argument("--config", required=True, metavar="FILE.yaml", help="the loop's config (docs/iterate.md)")
    return parser


def check_model_path(where: str, key: str, path: str | None) -> None:
    """Refuse a model directory that is not there (a hub name passes): before any fit."""
    from rlhf_lit.sources import _looks_local

    if path is None:
        return
    expanded = os.path.expanduser(path)
    if not os.path.isdir(expanded) and (os.path.exists(expanded) or _looks_local(path)):
        raise OptionError(f"{where}: {key} {path}: no such model directory")


def check_reward_model_path(where: str, key: str, path: str | None) -> None:
    """Refuse a reward model that is not there or is another kind of model (no trained score head)."""
    from rlhf_lit.evaluation.samples import check_reward_model

    check_model_path(where, key, path)
    if path is not None and os.path.isdir(os.path.expanduser(path)):
        try:
            check_reward_model(path)
        except (ValueError, OSError) as error:
            raise OptionError(f"{where}: {key} {path}: {str(error).split(': ', 1)[-1]}") from None


def check_stage_config(where: str, key: str, path: str, stage: str) -> None:
    """Refuse a stage config that is not YAML or names another stage class (``model.class_path``)."""
    try:
        class_path = model_class_path(path)
    except (OSError, ValueError) as error:
        raise OptionError(f"{where}: {key} {error}, not a stage config") from None  # the error names the file
    if class_path is None or class_path.rsplit(".", 1)[-1] != STAGE_CLASSES[stage]:
        raise OptionError(f"{where}: {key} {path}: model.class_path is {class_path!r}, not {STAGE_CLASSES[stage]}")


def read_loop_prompts(config: IterateConfig, where: str, tokenizer, chat: bool) -> tuple[list, list]:
    """``(held-out prompts, prompts to label)`` of the ``prompts`` source, read for the SFT model's ``tokenizer`` as
    the loop's policies read them (``chat``: HH transcripts as conversations), each cut to ``prompts.words``;
    enough for every iteration."""
    from rlhf_lit.data.prompt_source import read_prompt_source

    source = config.prompts.source()
    try:
        prompts = read_prompt_source(source, tokenizer, steps.template_option(chat)).prompts
    except (OSError, ValueError) as error:
        raise OptionError(f"{where}: prompts: {error}") from None
    if config.prompts.words is not None:
        prompts = [" ".join(p.split()[: config.prompts.words]) if isinstance(p, str) else p for p in prompts]
    need = config.prompts.held_out + config.iterations * config.prompts.per_iteration
    if len(prompts) < need:
        raise OptionError(
            f"{where}: prompts {source.name} holds {len(prompts)} prompts after skip; "
            f"held_out + iterations x per_iteration needs {need}"
        )
    return prompts[: config.prompts.held_out], prompts[config.prompts.held_out :]


def comparable(config: dict) -> dict:
    """A loop config (as ``iterate.json`` keeps it) as this version compares it: the keys and ``prompts`` keys
    added since it was written at their defaults, and ``field: prompt`` (the default before ``field`` could be
    unset, and what unset reads for every file it read) as unset."""
    prompts = {**asdict(PromptsGroup()), **config.get("prompts", {})}
    if prompts["field"] == "prompt":
        prompts["field"] = None
    return {**asdict(IterateConfig()), **config, "prompts": prompts}


def read_snapshot(snapshot: str, where: str) -> dict | None:
    """``iterate.json`` as the loop wrote it, or None when there is none or another program wrote it.

    Raises:
        OptionError: it is there but damaged (cut short, empty, not JSON), its ``config`` is not a mapping or a
            field a rerun compares is of another type (:func:`~rlhf_lit.commands.iterate_files.check_snapshot_fields`):
            it keeps the loop's config, which a rerun is checked against, so it is never redone in silence.
    """
    if not os.path.isfile(snapshot):
        return None
    try:
        kept = check_json_file(snapshot)
    except DamagedFile as damage:
        raise OptionError(
            f"{where}: {damage}; it keeps the loop's config, which a rerun is checked against: restore it, "
            "or give a new run_dir"
        ) from None
    if not (isinstance(kept, dict) and kept.get(WRITTEN_BY_KEY) == steps.WRITTEN_BY):
        return None
    if not isinstance(kept.get("config"), dict):
        raise OptionError(
            f"{where}: {snapshot}: field 'config' is {'missing' if 'config' not in kept else 'not a mapping'} "
            "(rlhf-lit iterate writes the loop's config there): restore it, or give a new run_dir"
        )
    try:
        check_snapshot_fields(snapshot, kept, CHAT_RENDERED_KEY)
    except ValueError as error:
        raise OptionError(f"{where}: {error}; restore it, or give a new run_dir") from None
    return kept


def check_run_dir(config: IterateConfig, where: str, chat: bool) -> None:
    """Refuse a run directory another program wrote, this loop with another config (more iterations extend it),
    or one whose labels were rendered otherwise than the policy reads prompts now (``chat``): a reward model
    refitted on raw text and chats together would score neither as the policy samples."""
    snapshot = os.path.join(config.run_dir, "iterate.json")
    if not os.path.isdir(config.run_dir) or not os.listdir(config.run_dir):
        return
    kept = read_snapshot(snapshot, where)
    if kept is None:
        raise OptionError(
            f"{where}: run_dir {config.run_dir} is not empty and holds no iterate.json of rlhf-lit "
            "iterate; give a new or empty run_dir"
        )
    old, new = comparable(kept["config"]), comparable(asdict(config))
    changed = sorted(k for k in set(old) | set(new) if k != "iterations" and old.get(k) != new.get(k))
    if changed:
        raise OptionError(
            f"{where}: run_dir {config.run_dir} was started with another config ({', '.join(changed)} "
            f"differ from {snapshot}); give a new run_dir, or put those back to resume it"
        )
    # Runs written before the rendering was recorded rendered their labels raw.
    if kept.get(CHAT_RENDERED_KEY, False) != chat:
        then, now = ("chats", "raw text") if not chat else ("raw text", "chats")
        raise OptionError(
            f"{where}: run_dir {config.run_dir} holds labels rendered as {then} ({snapshot}), but the policy "
            f"{config.sft_model} reads prompts as {now} now; give a new run_dir"
        )


def check_policy_rendering(config: IterateConfig, where: str) -> None:
    """Refuse policy-stage ``options`` that set how its data renders prompts: the loop decides it from the
    sft_model's tokenizer, so that the policy trains on prompts as they were sampled and labelled."""
    for option in getattr(config, config.policy).options:
        key = option.split("=")[0]
        if key.startswith("--data.") and key.endswith((".chat_template", ".apply_chat_template")):
            raise OptionError(
                f"{where}: {config.policy}.options {option}: iterate sets the {STAGE_NAMES[config.policy]} data's "
                "chat_template from the sft_model's tokenizer (always when it has a chat template, else never); "
                "leave it out"
            )


def check_labeler_template(config: IterateConfig, where: str, chat: bool) -> None:
    """Refuse a labelling reward model that cannot read the policy's chats (its tokenizer has no chat template)."""
    from rlhf_lit.data.rendering import has_chat_template
    from rlhf_lit.tokenizer import load_tokenizer

    if chat and config.labeler.kind == "reward_model" and not has_chat_template(load_tokenizer(config.labeler.source)):
        raise OptionError(
            f"{where}: labeler.source {config.labeler.source}: its tokenizer has no chat template, but the policy "
            f"({config.sft_model}) reads its prompts in one; label with a reward model that has it"
        )


def prepare(config: IterateConfig, where: str) -> tuple[list, list, list, bool, Scorer | None, Scorer | None]:
    """Every check before the first fit; what the iterations run on: ``(held-out prompts, prompts to label, initial
    reward data as the policy reads it, whether it reads string prompts in its chat template, the labeller as a
    scorer or None for labels from files, the summary's gold scorer)``, the scorers built once (a bad judge spec
    fails here)."""
    from rlhf_lit.tokenizer import load_tokenizer

    check_model_path(where, "sft_model", config.sft_model)
    check_reward_model_path(where, "reward_model.initial_model", config.reward_model.initial_model)
    for stage in steps.STAGES[config.policy]:
        check_stage_config(where, f"{stage}.config", getattr(config, stage).config, stage)
    tokenizer = load_tokenizer(config.sft_model)
    chat = steps.policy_reads_chat(tokenizer)
    held_out, fresh = read_loop_prompts(config, where, tokenizer, chat)
    check_run_dir(config, where, chat)
    check_policy_rendering(config, where)
    if config.labeler.kind == "reward_model":
        check_reward_model_path(where, "labeler.source", config.labeler.source)
        check_labeler_template(config, where, chat)
    elif config.labeler.kind == "file":
        for t in range(1, config.iterations + 1):  # those a person has written already: every record checked
            if os.path.isfile(steps.labels_file(config, t)):
                read_labels_file(steps.labels_file(config, t))
    scorer = steps.labeler_scorer(config, tokenizer)
    judge = config.evaluation.judge
    gold = JudgeScorer(judge, tokenizer=tokenizer, device=config.device) if judge is not None else scorer
    initial = read_labels_file(config.reward_model.initial_data) if config.reward_model.initial_data else []
    return held_out, fresh, [as_policy_read(r, chat) for r in initial], chat, scorer, gold


def format_table(rows: Sequence[dict]) -> str:
    """The summary rows as a plain-text table (``-`` where a value was not measured)."""
    cells = [[str(c) for c in COLUMNS]] + [
        ["-" if row.get(c) is None else f"{row[c]:.4f}" if isinstance(row[c], float) else str(row[c]) for c in COLUMNS]
        for row in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def write_summary(config: IterateConfig, rows: list[dict], timing: dict) -> None:
    """``summary.json`` (rows, config, timings) and ``summary.csv`` in the run directory."""
    write_json_atomically(
        os.path.join(config.run_dir, "summary.json"),
        {
            WRITTEN_BY_KEY: steps.WRITTEN_BY,
            "columns": list(COLUMNS),
            "rows": rows,
            "config": asdict(config),
            "timing_s": timing,
        },
    )
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(COLUMNS), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomically(os.path.join(config.run_dir, "summary.csv"), text.getvalue())


def baseline_row(config: IterateConfig, gold, held_out: list, chat: bool) -> dict:
    """Row 0: the SFT model on the held-out prompts (proxy: ``initial_model`` when given); kept in ``baseline.json``."""
    path = os.path.join(config.run_dir, "baseline.json")
    done = steps.intact_json(path)
    if done is not None:
        return checked_row(path, done, 0)
    row = {
        "iteration": 0,
        **steps.evaluate(config, config.sft_model, steps.proxy_model(config, 0), gold, held_out, chat),
    }
    write_json_atomically(path, {WRITTEN_BY_KEY: steps.WRITTEN_BY, "row": row})
    return row


def run_loop(config: IterateConfig, loop: tuple) -> list[dict]:
    """The iterations (each step skipped when its output is there and intact) on what :func:`prepare` gave;
    the summary rows."""
    held_out, fresh, initial, chat, scorer, gold = loop
    write_json_atomically(
        os.path.join(config.run_dir, "iterate.json"),
        {WRITTEN_BY_KEY: steps.WRITTEN_BY, "config": asdict(config), CHAT_RENDERED_KEY: chat},
    )
    rows = [baseline_row(config, gold, held_out, chat)]
    n = config.prompts.per_iteration
    for t in range(1, config.iterations + 1):
        paths = steps.Paths(config.run_dir, t)
        seconds: dict = {}
        t0 = time.perf_counter()
        samples = steps.sample(config, paths, fresh[(t - 1) * n : t * n], chat)
        train, held = steps.label(config, paths, samples, scorer, chat)
        seconds["sample_and_label"] = time.perf_counter() - t0
        if config.policy == "ppo":
            data = steps.reward_data(config, paths, initial)
            trains = f"the reward model trains on {len(data)} records ({config.reward_model.data})"
        else:
            data, pairs = [], steps.bonbon_pairs(config, paths, samples, chat)
            trains = f"BoNBoN trains on {len(pairs)} best-and-worst pairs"
        print(f"iteration {t}: {len(train) + len(held)} prompts labelled ({len(held)} held out); {trains}", flush=True)
        for stage in steps.STAGES[config.policy]:
            seconds[stage] = steps.fit(config, paths, stage, run_fit, chat)
        t0 = time.perf_counter()
        rows.append(steps.iteration_metrics(config, paths, train, held, data, gold, held_out, seconds, chat))
        seconds["metrics"] = time.perf_counter() - t0
    return rows


def main(argv: Sequence[str]) -> int:
    """Run ``rlhf-lit iterate`` with ``argv`` (the options after the command name); returns the exit status."""
    args = build_parser().parse_args(list(argv))
    config = read_config(args.config)
    loop = prepare(config, args.config)
    os.makedirs(config.run_dir, exist_ok=True)
    t0 = time.perf_counter()
    with stop_on_signals("iterate"):  # SIGTERM and SIGINT unwind the loop (exit status 143, 130) and stop the fit
        rows = run_loop(config, loop)
    write_summary(config, rows, {"total": time.perf_counter() - t0})
    print(format_table(rows))
    print(
        f"summary: {os.path.join(config.run_dir, 'summary.csv')} and summary.json; the final policy: "
        f"{steps.Paths(config.run_dir, config.iterations).export(config.policy)}",
        flush=True,
    )
    return 0

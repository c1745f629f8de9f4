"""The steps of one iteration of ``rlhf-lit iterate`` (:mod:`rlhf_lit.commands.iterate_command` runs them).

Iteration t, in ``<run_dir>/iter_<t>/``:

1. ``samples.jsonl``: K responses to each of the iteration's fresh prompts from the current policy
   (the SFT model at t = 1, else iteration t - 1's PPO export), sampled with seed ``seed + t``, its prompts
   rendered as :func:`policy_reads_chat` says.
2. ``labels.json``: those samples ranked by the labeller (or a person's labels file), split into ``train``
   and ``held_out`` by ``reward_model.held_out_fraction``, kept as the policy read them
   (:func:`~rlhf_lit.commands.iterate_labels.as_policy_read`).
3. ``reward_data.jsonl``: the reward model's training data, ``all`` or ``latest`` (:data:`RewardData`).
4. ``reward_model/``: ``rlhf-lit fit --config <reward_model.config> --run_dir iter_<t>`` (export ``reward_model/model``).
5. ``ppo/``: ``rlhf-lit fit --config <ppo.config> --run_dir iter_<t>`` (export ``ppo/model``).
6. ``metrics.json``: the reward models' accuracy on the held-out labels before and after the refit, the
   new policy on the held-out prompts: gold (labeller) score, proxy (the new RM) score, KL to the SFT model,
   and what the PPO run logged last (proxy, judge, KL) with the guard's signals that fired.

With ``policy: bonbon`` (:data:`~rlhf_lit.commands.iterate_config.PolicyStage`) steps 3 to 5 are instead
``bonbon_pairs.jsonl`` (:func:`bonbon_pairs`: the best and the worst of each prompt's K samples by the
labeller's scores, as ``rlhf-lit best-of-n --pairs-out`` writes them) and ``bonbon/``: ``rlhf-lit fit --config
<bonbon.config> --run_dir iter_<t>`` from the policy that drew the samples (export ``bonbon/model``); step 6
measures the new policy alone (the proxy: a labelling reward model's score).

Every file is written atomically (:mod:`rlhf_lit.artifacts`) and read back checked (:mod:`rlhf_lit.integrity`);
a step whose output is there and intact is skipped, so a killed loop continues where it stopped. A file that
parses but holds a field of another type or none (edited by hand) is refused in one line naming the file and the
field (:mod:`rlhf_lit.commands.iterate_files`). A fit is
done when its export holds the export marker and its files check out; otherwise it runs again (a damaged
export is replaced).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rlhf_lit.artifacts import EXPORT_MARKER, WRITTEN_BY_KEY, write_json_atomically, write_jsonl_atomically
from rlhf_lit.child_runs import RunFailed
from rlhf_lit.commands.iterate_config import IterateConfig
from rlhf_lit.commands.iterate_files import (
    SAMPLE_SCORES_KEY,
    checked_labels,
    checked_row,
    checked_sample_scores,
    checked_samples,
)
from rlhf_lit.commands.iterate_labels import (
    JudgeScorer,
    Scorer,
    as_policy_read,
    best_and_worst_of_k,
    count_pairs,
    pairwise_accuracy,
    rank_by_scores,
    read_labels_file,
    score_responses,
    split_held_out,
)
from rlhf_lit.commands.iterate_signals import PPO_SIGNALS, ppo_log_signals
from rlhf_lit.evaluation.reward_judge import RewardModelScorer
from rlhf_lit.integrity import DamagedFile, check_json_file, check_jsonl_file, check_model_directory

log = logging.getLogger(__name__)

WRITTEN_BY = "rlhf-lit iterate"
STAGES = {"ppo": ("reward_model", "ppo"), "bonbon": ("bonbon",)}
"""The run-directory stages of one iteration (:class:`rlhf_lit.stages.base.RunLayout` names), in order, per
:data:`~rlhf_lit.commands.iterate_config.PolicyStage`; the last one's export is the iteration's policy."""

FitRunner = Callable[[list[str], str], int]
"""``(fit arguments after rlhf-lit, log file) -> exit status``: how a stage's ``rlhf-lit fit`` is run
(:func:`rlhf_lit.child_runs.run_rlhf_lit`: a child process, stopped with the loop)."""


@dataclass
class Paths:
    """The files of iteration ``t`` under ``run_dir``."""

    run_dir: str
    t: int

    @property
    def dir(self) -> str:
        """``<run_dir>/iter_<t>``: the ``--run_dir`` of the iteration's fits."""
        return os.path.join(self.run_dir, f"iter_{self.t}")

    def file(self, name: str) -> str:
        """A file of the iteration."""
        return os.path.join(self.dir, name)

    def export(self, stage: str) -> str:
        """The stage's export, ``iter_<t>/<stage>/model``."""
        return os.path.join(self.dir, stage, "model")


def intact(path: str, read: Callable[[str], Any] = check_jsonl_file) -> Any:
    """What ``read`` (an :mod:`rlhf_lit.integrity` check: by default the records of a JSONL file) gives of a file
    rlhf-lit wrote, or None when it is missing or damaged (then redone)."""
    if not os.path.isfile(path):
        return None
    try:
        return read(path)
    except (DamagedFile, OSError) as damage:
        log.info("%s: redoing it (%s)", path, damage)
        return None


def intact_json(path: str) -> dict | None:
    """A JSON object rlhf-lit's iterate wrote, or None when missing, damaged or not its own."""
    value = intact(path, check_json_file)
    return value if isinstance(value, dict) and value.get(WRITTEN_BY_KEY) == WRITTEN_BY else None


def export_state(path: str) -> str:
    """``absent``, ``done`` (marker written, every file intact) or ``damaged`` (marker there, a file not)."""
    if not os.path.isfile(os.path.join(path, EXPORT_MARKER)):
        return "absent"
    from rlhf_lit.models.reward_ensemble import is_reward_ensemble, member_paths

    try:
        for directory in member_paths(path) if is_reward_ensemble(path) else [path]:
            check_model_directory(directory)
    except (DamagedFile, OSError, ValueError) as damage:
        log.info("%s: damaged (%s): trained again", path, damage)
        return "damaged"
    return "done"


def policy_of(config: IterateConfig, t: int) -> str:
    """The policy sampled at iteration t: the SFT model at t = 1, else iteration t - 1's policy export (PPO's, or
    BoNBoN's under ``policy: bonbon``)."""
    return config.sft_model if t == 1 else Paths(config.run_dir, t - 1).export(config.policy)


def proxy_model(config: IterateConfig, t: int) -> str | None:
    """The reward model whose score of iteration t's policy is the summary's proxy (t = 0: the SFT model): under
    ``ppo`` the iteration's refit (t = 0: ``initial_model``); under ``bonbon`` a labelling reward model, else none."""
    if config.policy == "bonbon":
        return config.labeler.source if config.labeler.kind == "reward_model" else None
    return config.reward_model.initial_model if t == 0 else Paths(config.run_dir, t).export("reward_model")


def reward_model_before(config: IterateConfig, t: int) -> str | None:
    """The reward model before iteration t's refit: ``initial_model`` at t = 1, else iteration t - 1's."""
    return config.reward_model.initial_model if t == 1 else Paths(config.run_dir, t - 1).export("reward_model")


def reward_model_start(config: IterateConfig, t: int) -> str:
    """Where iteration t's reward model starts (:data:`~rlhf_lit.commands.iterate_config.RewardInit`)."""
    if config.reward_model.init == "sft":
        return config.sft_model
    return reward_model_before(config, t) or config.sft_model


def ppo_start(config: IterateConfig, t: int) -> str:
    """Where iteration t's PPO starts (:data:`~rlhf_lit.commands.iterate_config.PolicyStart`)."""
    return config.sft_model if config.ppo.start == "restart" else policy_of(config, t)


def policy_reads_chat(tokenizer: Any) -> bool:
    """Whether the loop's policies read string prompts in their chat template: ``auto`` (as ``rlhf-lit evaluate``
    samples) for the SFT model's ``tokenizer``, which every PPO export keeps. The one answer for the sampling, the
    labels, the reward data and the summary, so that the reward model trains on what it later scores."""
    from rlhf_lit.data.rendering import resolve_template

    return resolve_template("auto", tokenizer, "sft_model").chat


def template_option(chat: bool) -> str:
    """:func:`policy_reads_chat`'s answer as the sampling's ``chat_template`` option."""
    return "always" if chat else "never"


def labeler_scorer(config: IterateConfig, tokenizer: Any) -> Scorer | None:
    """The labeller as a scorer (a judge, reading prompts rendered by the policy's ``tokenizer``, or a reward
    model); None for labels from files."""
    if config.labeler.kind == "judge":
        return JudgeScorer(config.labeler.source, config.labeler.judge_reads, tokenizer, config.device)
    if config.labeler.kind == "reward_model":
        return RewardModelScorer(config.labeler.source, config.device)
    return None


def labels_file(config: IterateConfig, t: int) -> str:
    """The labels file a person writes for iteration t (``labeler.source`` with ``{t}``)."""
    return config.labeler.source.replace("{t}", str(t))


def loop_sampling(config: IterateConfig) -> Any:
    """The :class:`~rlhf_lit.models.generation.SamplingConfig` of the labelled responses and of the evaluation."""
    from rlhf_lit.models.generation import SamplingConfig

    return SamplingConfig(max_new_tokens=config.sampling.max_new_tokens, temperature=config.sampling.temperature)


def sample(config: IterateConfig, paths: Paths, prompts: Sequence, chat: bool) -> list[dict]:
    """Step 1: ``samples.jsonl`` (reused when intact): per prompt ``{"prompt", "prompt_text", "responses"}``."""
    done = intact(paths.file("samples.jsonl"))
    if done is not None:
        return checked_samples(paths.file("samples.jsonl"), done, config.sampling.responses_per_prompt)
    from rlhf_lit.evaluation.samples import load_models, sample_and_measure

    k = config.sampling.responses_per_prompt
    models = load_models(
        policy_of(config, paths.t),
        prompts=list(prompts),
        chat_template=template_option(chat),
        repeat=k,
        device=config.device,
    )
    out, _ = sample_and_measure(
        models, models.prompts, loop_sampling(config), batch_size=config.sampling.batch_size, seed=config.seed + paths.t
    )
    records = [
        {"prompt": prompt, "prompt_text": out.prompts[n * k], "responses": out.responses[n * k : (n + 1) * k]}
        for n, prompt in enumerate(prompts)
    ]
    os.makedirs(paths.dir, exist_ok=True)
    write_jsonl_atomically(paths.file("samples.jsonl"), records)
    return records


def label(
    config: IterateConfig, paths: Paths, samples: list[dict], scorer: Scorer | None, chat: bool
) -> tuple[list, list]:
    """Step 2: the iteration's labels as the policy read them, ``(train, held_out)`` (reused when ``labels.json``
    is intact)."""
    done = intact_json(paths.file("labels.json"))
    if done is not None:
        return checked_labels(paths.file("labels.json"), done)
    scores = None
    if scorer is None:
        source = labels_file(config, paths.t)
        if not os.path.isfile(source):
            raise ValueError(
                f"iteration {paths.t}: label the responses in {paths.file('samples.jsonl')} and write "
                f"them to {source} (rankings or pairs records), then run the same command again"
            )
        records = read_labels_file(source)
    else:
        scores = score_responses(scorer, [as_policy_read(s, chat) for s in samples])
        ranked = [rank_by_scores(s["prompt"], s["responses"], x) for s, x in zip(samples, scores)]
        records = [r for r in ranked if r is not None]
        if not records:
            raise ValueError(
                f"iteration {paths.t}: the labeller ranked no prompt (every prompt's responses tie or "
                "repeat); sample more responses per prompt or longer ones"
            )
    records = [{**as_policy_read(r, chat), "iteration": paths.t} for r in records]
    # Under bonbon no reward model is refitted, so none is measured on held-out labels.
    fraction = config.reward_model.held_out_fraction if config.policy == "ppo" else 0.0
    train, held = split_held_out(records, fraction, config.seed + paths.t)
    labels = {WRITTEN_BY_KEY: WRITTEN_BY, "train": train, "held_out": held, SAMPLE_SCORES_KEY: scores}
    write_json_atomically(paths.file("labels.json"), labels)
    return train, held


def bonbon_pairs(config: IterateConfig, paths: Paths, samples: list[dict], chat: bool) -> list[dict]:
    """``bonbon_pairs.jsonl`` (``policy: bonbon``; :func:`~rlhf_lit.commands.iterate_labels.best_and_worst_of_k`
    of the samples by the labeller's scores kept in ``labels.json``; reused when intact)."""
    done = intact(paths.file("bonbon_pairs.jsonl"))
    if done is not None:
        return done
    labels = intact_json(paths.file("labels.json"))
    if labels is None:
        raise ValueError(f"iteration {paths.t}: {paths.file('labels.json')} holds no labeller score of every sample")
    checked_labels(paths.file("labels.json"), labels)
    scores = checked_sample_scores(paths.file("labels.json"), labels, samples)
    k = config.sampling.responses_per_prompt  # N of every record: the n the BoNBoN fit is given (fit_args)
    records, tied, empty = best_and_worst_of_k(samples, scores, k, config.labeler.source, WRITTEN_BY, chat)
    if not records:
        raise ValueError(
            f"iteration {paths.t}: no prompt's best and worst sample differ ({tied} tie, {empty} with an empty "
            "reply); sample more responses per prompt or longer ones"
        )
    write_jsonl_atomically(paths.file("bonbon_pairs.jsonl"), records)
    log.info(
        "iteration %d: %d BoNBoN pairs (%d prompts tie, %d with an empty reply)", paths.t, len(records), tied, empty
    )
    return records


def reward_data(config: IterateConfig, paths: Paths, initial: list[dict]) -> list[dict]:
    """Step 3: ``reward_data.jsonl``, what the reward model of iteration t trains on (:data:`RewardData`):
    ``all``: ``initial`` and the train labels of iterations 1..t; ``latest``: iteration t's alone."""
    first = 1 if config.reward_model.data == "all" else paths.t
    records = list(initial) if config.reward_model.data == "all" else []
    for t in range(first, paths.t + 1):
        part = intact_json(Paths(config.run_dir, t).file("labels.json"))
        if part is None:
            raise ValueError(
                f"iteration {paths.t}: {Paths(config.run_dir, t).file('labels.json')} is missing "
                "or damaged; the reward data of an `all` run needs every earlier iteration's labels"
            )
        records += checked_labels(Paths(config.run_dir, t).file("labels.json"), part)[0]
    write_jsonl_atomically(paths.file("reward_data.jsonl"), records)
    return records


def fit_args(config: IterateConfig, paths: Paths, stage: str, replace: bool, chat: bool) -> list[str]:
    """The ``rlhf-lit fit`` arguments of a stage of iteration t: the user's config, the iteration's run
    directory and seed, the inputs the loop decides (PPO's prompts rendered as :func:`policy_reads_chat` says:
    ``chat``), then the user's extra options."""
    from rlhf_lit.data.rankings import RANKS_FIELD

    group = {"reward_model": config.reward_model, "ppo": config.ppo, "bonbon": config.bonbon}[stage]
    args = ["fit", "--config", group.config, "--run_dir", paths.dir, "--seed_everything", str(config.seed)]
    if stage == "bonbon":
        # The policy that drew the samples is BoNBoN's start and its reference (the moving anchor).
        args += [
            "--model.init_args.model",
            policy_of(config, paths.t),
            "--model.init_args.n",
            str(config.sampling.responses_per_prompt),
            "--data.init_args.train_path",
            paths.file("bonbon_pairs.jsonl"),
            "--data.init_args.format",
            "fields",
            "--data.init_args.chat_template",
            template_option(chat),
        ]
    elif stage == "reward_model":
        args += [
            "--model.init_args.model",
            reward_model_start(config, paths.t),
            "--data.init_args.train_path",
            paths.file("reward_data.jsonl"),
            "--data.init_args.format",
            "rankings",
            "--data.init_args.fields.ranks",
            RANKS_FIELD,
        ]
    else:
        args += [
            "--model.init_args.sft_model",
            ppo_start(config, paths.t),
            "--model.init_args.reward_model",
            paths.export("reward_model"),
            # PPO samples string prompts as the labels were rendered (prepare refuses ppo.options that set it).
            "--data.init_args.chat_template",
            template_option(chat),
        ]
    if replace:
        args += ["--model.init_args.export_existing", "replace"]
    return [*args, *group.options]


def fit(config: IterateConfig, paths: Paths, stage: str, runner: FitRunner, chat: bool) -> float | None:
    """Steps 4 and 5: the stage's fit unless its export is done; seconds it took (None when skipped)."""
    state = export_state(paths.export(stage))
    if state == "done":
        print(f"iteration {paths.t}: {stage}: done, {paths.export(stage)} (skipped)", flush=True)
        return None
    log_path = paths.file(f"{stage}.log")
    print(f"iteration {paths.t}: {stage}: fitting (log {log_path})", flush=True)
    t0 = time.perf_counter()
    status = runner(fit_args(config, paths, stage, replace=state == "damaged", chat=chat), log_path)
    if status != 0 or export_state(paths.export(stage)) != "done":
        raise ValueError(f"iteration {paths.t}: {RunFailed(f'the {stage} fit', status, log_path)}")
    return time.perf_counter() - t0


def evaluate(
    config: IterateConfig,
    policy: str,
    reward_model: str | None,
    gold: Scorer | None,
    eval_prompts: Sequence,
    chat: bool,
) -> dict:
    """The policy on the held-out prompts: ``gold`` (labeller) and ``proxy`` (reward model) means, KL to SFT."""
    from rlhf_lit.evaluation.policy_metrics import evaluate_policy

    result = evaluate_policy(
        policy,
        list(eval_prompts),
        reference=config.sft_model,
        reward_model=reward_model,
        chat_template=template_option(chat),
        sampling=loop_sampling(config),
        batch_size=config.sampling.batch_size,
        seed=config.seed,
        device=config.device,
    )
    metrics = result["metrics"]
    rows = result["samples"]
    read = [as_policy_read({"prompt": r["prompt"], "responses": [r["response"]]}, chat) for r in rows]
    gold_scores = [score for (score,) in score_responses(gold, read)] if gold is not None else None
    return {
        "gold": None if gold_scores is None else sum(gold_scores) / len(gold_scores),
        "proxy": metrics.get("rm_mean"),
        "kl": metrics.get("kl_mean"),
        "length": metrics["length_mean"],
    }


def iteration_metrics(
    config: IterateConfig,
    paths: Paths,
    train: list,
    held: list,
    data: list,
    gold: Scorer | None,
    eval_prompts: Sequence,
    seconds: dict,
    chat: bool,
) -> dict:
    """Step 6: ``metrics.json`` (reused when intact): the row of iteration t in the summary (``data``: the reward
    model's training records, none under ``bonbon``)."""
    done = intact_json(paths.file("metrics.json"))
    if done is not None:
        return checked_row(paths.file("metrics.json"), done, paths.t)
    row = {
        "iteration": paths.t,
        "labelled_prompts": len(train) + len(held),
        "labelled_pairs": count_pairs(train + held),
        "rm_train_records": len(data) if config.policy == "ppo" else None,
        "held_out_pairs": None,
        "rm_acc_before": None,
        "rm_acc_after": None,
    }
    if config.policy == "ppo":
        before = reward_model_before(config, paths.t)
        acc_before = pairwise_accuracy(RewardModelScorer(before, config.device), held)[0] if before and held else None
        after = paths.export("reward_model")
        acc_after, held_pairs = pairwise_accuracy(RewardModelScorer(after, config.device), held) if held else (None, 0)
        row.update(held_out_pairs=held_pairs, rm_acc_before=acc_before, rm_acc_after=acc_after)
    policy = paths.export(config.policy)
    row.update(evaluate(config, policy, proxy_model(config, paths.t), gold, eval_prompts, chat))
    row.update(ppo_log_signals(paths) if config.policy == "ppo" else dict.fromkeys(PPO_SIGNALS))
    write_json_atomically(paths.file("metrics.json"), {WRITTEN_BY_KEY: WRITTEN_BY, "row": row, "timing_s": seconds})
    return row

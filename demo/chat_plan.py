"""The chat demo's plan: how much work each stage does (:class:`ChatBudget`), the commands it runs and
what it reads from ``configs/demo_chat`` (the toy demo's plan: :mod:`demo.plan`, whose :class:`Paths`
and ``--out`` folder rules it shares).

The chat demo has no SFT stage: SmolLM2-135M-Instruct is already instruction-tuned, so it is the
policy's start, PPO's and DPO's reference and the model the labels are sampled from.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from demo.plan import ROOT, Paths, ppo_init_args, ppo_unfinished
from demo.runner import fit_command, rollout_checkpointing
from rlhf_lit.child_runs import rlhf_lit_command

CONFIGS = ROOT / "configs" / "demo_chat"
"""``reward_model.yaml``, ``dpo.yaml``, ``ppo.yaml`` of the chat demo."""
HH_FILE = ROOT / "assets" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
"""The shipped HH-RLHF harmless-base transcripts whose first human turns are the prompts."""


@dataclass(frozen=True)
class ChatBudget:
    """How much work each stage does; ``CHAT_TINY`` is the smoke-test budget.

    Override lists are extra ``rlhf-lit fit`` options (empty: as the config says).
    """

    eval_prompts: int = 128
    label_prompts: int = 950
    samples_per_prompt: int = 4
    reward_model: tuple[str, ...] = ()
    dpo: tuple[str, ...] = ()
    ppo: tuple[str, ...] = ()
    bon_n_max: int = 8
    checkpoint_every: int = 8  # PPO rollouts between the checkpoints evaluated on the frontier
    max_new_tokens: int | None = None  # None: the PPO config's; else every stage samples this many
    threads: int = 2  # torch threads of a stage that runs alone


CHAT_FULL = ChatBudget()
WARMUP_1 = ("--model.init_args.optimizer.warmup_steps", "1")
TOP_BLOCK = ("--model.init_args.trainable_layers", "1")  # also fits a model cut to a few blocks
CHAT_TINY = ChatBudget(
    eval_prompts=4,
    label_prompts=12,
    samples_per_prompt=3,
    reward_model=("--trainer.max_epochs", "1", "--data.init_args.batch_size", "4", *WARMUP_1, *TOP_BLOCK),
    dpo=("--trainer.max_steps", "2", "--data.init_args.batch_size", "4", *WARMUP_1, *TOP_BLOCK),
    ppo=(
        *TOP_BLOCK,
        "--model.init_args.max_rollouts",
        "2",
        "--data.init_args.batch_size",
        "4",
        "--model.init_args.ppo.minibatch_size",
        "4",
        "--model.init_args.ppo.epochs",
        "1",
    ),
    bon_n_max=2,
    checkpoint_every=1,
    max_new_tokens=8,
    threads=1,
)


def demo_sampling(budget: ChatBudget):
    """The :class:`~rlhf_lit.models.generation.SamplingConfig` PPO samples with (temperature, token draw and
    ``max_new_tokens`` of ``configs/demo_chat/ppo.yaml``, or the budget's); labels, best-of-N and the
    evaluation sample with the same."""
    from rlhf_lit.models.generation import SamplingConfig

    sampling = ppo_init_args(CONFIGS / "ppo.yaml").get("sampling", {})
    return SamplingConfig(
        temperature=float(sampling.get("temperature", 1.0)),
        max_new_tokens=budget.max_new_tokens or int(sampling["max_new_tokens"]),
        draw=sampling.get("draw", "multinomial"),
    )


def sampling_options(budget: ChatBudget) -> list[str]:
    """:func:`demo_sampling` as the options of ``python -m demo preferences`` and ``rlhf-lit best-of-n``."""
    sampling = demo_sampling(budget)
    return [
        "--temperature",
        str(sampling.temperature),
        "--max-new-tokens",
        str(sampling.max_new_tokens),
        "--draw",
        sampling.draw,
    ]


def rollouts(budget: ChatBudget) -> int:
    """How many rollouts PPO makes: the budget's override, else the config's ``max_rollouts``."""
    flag = "--model.init_args.max_rollouts"
    if flag in budget.ppo:
        return int(budget.ppo[budget.ppo.index(flag) + 1])
    return int(ppo_init_args(CONFIGS / "ppo.yaml")["max_rollouts"])


def demo_precision(choice: str, device: str = "cpu") -> str:
    """The precision of every stage of the demo (labels, reward model, DPO, PPO, best-of-N, evaluation) for
    the ``--precision`` choice: ``auto`` is ``bf16-mixed`` on a CPU that multiplies bf16 natively
    (``amx_bf16`` or ``avx512_bf16``: faster sampling and reward-model steps there, at no accuracy cost
    measured, ``docs/DEMO-CHAT.md``) or on a GPU that has bf16, else ``32-true`` (emulated bf16 is slower)."""
    from rlhf_lit.models.precision import has_native

    if choice != "auto":
        return choice
    if device == "cuda":
        import torch

        return "bf16-mixed" if torch.cuda.is_bf16_supported() else "32-true"
    return "bf16-mixed" if has_native("bf16-mixed") else "32-true"


DEVICES = ("cpu", "cuda")
"""Where the chat demo runs every stage (``--device``)."""


def on_device(command: list[str], device: str) -> list[str]:
    """``command`` (a stage of :mod:`demo.chat_pipeline`) run on ``device``: an ``rlhf-lit fit`` gets the
    Trainer's accelerator (the configs name ``cpu``), the sampling commands (``python -m demo preferences``,
    ``rlhf-lit best-of-n``) their ``--device``."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, not {device!r}")
    if "fit" in command:
        return [*command, "--trainer.accelerator", "gpu" if device == "cuda" else "cpu"]
    return [*command, "--device", device]


def logger_root(paths: Paths, seed: int | None) -> list[str]:
    """The options every fit takes: its TensorBoard logs under ``--out``, and the run seed when given."""
    seeds = [] if seed is None else ["--seed_everything", str(seed)]
    return ["--trainer.logger.init_args.save_dir", str(paths.root), *seeds]


def preferences_command(
    model: str, paths: Paths, budget: ChatBudget, judge: str, seed: int | None, precision: str
) -> list[str]:
    """``python -m demo preferences``: K replies per labelling request, judged, as best-vs-worst pairs
    (DPO's data) and rankings (the reward model's), at PPO's sampling settings, sampled at ``precision``."""
    return [
        sys.executable,
        "-m",
        "demo",
        "preferences",
        "--model",
        model,
        "--prompts",
        str(paths.dir("data") / "label.jsonl"),
        "--out",
        str(paths.dir("prefs") / "pairs.jsonl"),
        "--rankings-out",
        str(paths.dir("prefs") / "rankings.jsonl"),
        "--samples-per-prompt",
        str(budget.samples_per_prompt),
        "--judge",
        judge,
        *sampling_options(budget),
        "--seed",
        str(seed or 0),
        "--precision",
        precision,
    ]


def reward_model_command(model: str, paths: Paths, budget: ChatBudget, seed: int | None, precision: str) -> list[str]:
    """``rlhf-lit fit`` of the reward model on the rankings, at ``trainer.precision`` ``precision``."""
    return fit_command(
        CONFIGS / "reward_model.yaml",
        [
            *logger_root(paths, seed),
            "--model.init_args.model",
            model,
            "--model.init_args.export_dir",
            str(paths.model("reward_model")),
            "--data.init_args.train_path",
            str(paths.dir("prefs") / "rankings.jsonl"),
            "--trainer.precision",
            precision,
            *budget.reward_model,
        ],
    )


def dpo_command(
    model: str, paths: Paths, budget: ChatBudget, beta: float, seed: int | None, precision: str
) -> list[str]:
    """``rlhf-lit fit`` of DPO at ``beta`` on the best-vs-worst pairs (its folder: ``dpo/beta_<b>``), at
    ``trainer.precision`` ``precision``."""
    stage = f"dpo/beta_{beta:g}"
    return fit_command(
        CONFIGS / "dpo.yaml",
        [
            *logger_root(paths, seed),
            "--trainer.logger.init_args.name",
            stage,
            "--model.init_args.model",
            model,
            "--model.init_args.beta",
            str(beta),
            "--model.init_args.export_dir",
            str(paths.model(stage)),
            "--data.init_args.train_path",
            str(paths.dir("prefs") / "pairs.jsonl"),
            "--trainer.precision",
            precision,
            *budget.dpo,
        ],
    )


def ppo_command(
    model: str, paths: Paths, budget: ChatBudget, judge: str, seed: int | None, precision: str
) -> list[str]:
    """``rlhf-lit fit`` of PPO against the reward model, with checkpoints for the frontier, at
    ``trainer.precision`` ``precision``."""
    max_new_tokens = budget.max_new_tokens
    return fit_command(
        CONFIGS / "ppo.yaml",
        [
            *logger_root(paths, seed),
            "--model.init_args.sft_model",
            model,
            "--model.init_args.reward_model",
            str(paths.model("reward_model")),
            "--model.init_args.judge",
            judge,
            "--model.init_args.export_dir",
            str(paths.model("ppo")),
            "--data.init_args.train_path",
            str(paths.dir("data") / "ppo.jsonl"),
            *rollout_checkpointing(budget.checkpoint_every, paths.checkpoints),
            "--trainer.precision",
            precision,
            *budget.ppo,
            *([] if max_new_tokens is None else ["--model.init_args.sampling.max_new_tokens", str(max_new_tokens)]),
            *([] if seed is None else ["--model.init_args.rollout_seed", str(seed)]),
        ],
    )


def best_of_n_command(
    model: str, paths: Paths, budget: ChatBudget, judge: str, seed: int | None, precision: str
) -> list[str]:
    """``rlhf-lit best-of-n``: N = 1 .. ``bon_n_max`` replies of the instruction model to each held-out
    request, the reward model's pick, scored as PPO's reward model reads a cut reply (``reward.unfinished``;
    the PPO config's price for a cut reply is not part of the pick: best-of-N ranks by the reward model
    alone), sampled at ``precision``."""
    return rlhf_lit_command(
        [
            "best-of-n",
            "--policy",
            model,
            "--reward-model",
            str(paths.model("reward_model")),
            "--prompts",
            str(paths.dir("data") / "eval.jsonl"),
            "--judge",
            judge,
            "--n-max",
            str(budget.bon_n_max),
            *sampling_options(budget),
            "--seed",
            str(seed or 0),
            "--unfinished",
            ppo_unfinished(CONFIGS / "ppo.yaml"),
            "--precision",
            precision,
            "--out",
            str(paths.dir("best_of_n") / "best_of_n.json"),
        ]
    )


def fetched_model() -> str:
    """SmolLM2-135M-Instruct's folder, fetched into the cache first when it is not there intact
    (``scripts/fetch_smollm2.py``, as ``make smollm2`` runs it): for the benches, which a user starts by hand."""
    import subprocess

    fetch = [sys.executable, str(ROOT / "scripts" / "fetch_smollm2.py")]
    return subprocess.run(fetch, capture_output=True, text=True, check=True).stdout.split()[-1]


def default_model() -> str:
    """Where ``make smollm2`` caches SmolLM2-135M-Instruct (``scripts/fetch_smollm2.py`` without fetching)."""
    import os

    cache = os.environ.get("RLHF_LIT_CACHE") or str(Path.home() / ".cache" / "rlhf-lit")
    return str(Path(cache) / "models" / "SmolLM2-135M-Instruct")

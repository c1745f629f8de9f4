"""The demo's plan: where every output goes under ``--out``, how much work each stage does, and
what the stages read from the demo configs; the ``--out`` folder is claimed here.

The pipeline marks a folder it creates with :data:`MARKER` and refuses (exit status 2) to clear a
non-empty ``--out`` without that marker, so it never deletes files it did not write (the rule of
:mod:`rlhf_lit.artifacts`).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

from rlhf_lit.artifacts import claim_directory, clear_owned_entries, directory_state
from rlhf_lit.child_runs import rlhf_lit_command

ROOT = Path(__file__).resolve().parents[1]
"""The project checkout the demo runs from: ``demo/`` sits beside ``configs/`` and the offline assets
(``assets/``, see assets/README.md), which no installed wheel carries."""
ASSETS = ROOT / "assets"
STAGE_DIRS = ("data", "logs", "sft", "prefs", "reward_model", "ppo", "ppo_kl0", "dpo", "best_of_n", "eval", "report")
"""The folders the pipeline writes under ``--out`` (and clears before a run; nothing else)."""
MARKER = ".rlhf-lit-demo.json"
"""Written into ``--out`` by the pipeline: the folder is the demo's, so a rerun may clear its stage folders."""
RESULTS = "results.json"
"""The run's summary under ``--out`` (replaced by a rerun)."""
DEFAULT_DPO_BETAS = (0.05, 0.1, 0.3)
"""The DPO runs of the frontier (``--dpo-betas``)."""


class NotADemoFolder(RuntimeError):
    """``--out`` holds files and no :data:`MARKER`: the pipeline did not create it and will not clear it."""


@dataclass(frozen=True)
class Budget:
    """How much work each stage does; ``TINY`` is the test budget (the whole run in under a minute).

    Empty override lists mean "as the config says".
    """

    sft: tuple[str, ...] = ()
    reward_model: tuple[str, ...] = ()
    ppo: tuple[str, ...] = ()
    pref_prompts: int | None = None  # None = the whole RM paragraph range
    samples_per_prompt: int = 4
    eval_prompts: int | None = None  # None = the whole held-out range (256 prompts)
    max_new_tokens: int | None = None  # None = the PPO config's; else PPO, preferences and eval use it
    dpo: tuple[str, ...] = ()
    checkpoint_every: int = 10  # PPO rollouts between the checkpoints evaluated on the frontier
    # Best-of-N samples bon_n_max completions per prompt: 64 x 256 prompts took 145 s of CPU, the
    # largest stage; 128 prompts halve it, with standard errors of about 0.01-0.02 judge score.
    bon_prompts: int | None = 128  # None = as many held-out prompts as the evaluation
    bon_n_max: int = 64


FULL = Budget()
TINY = Budget(
    sft=(
        "--trainer.max_steps",
        "3",
        "--trainer.val_check_interval",
        "3",
        "--data.init_args.max_records",
        "48",
        "--model.init_args.optimizer.warmup_steps",
        "1",
    ),
    reward_model=(
        "--trainer.max_epochs",
        "1",
        "--data.init_args.batch_size",
        "8",
        "--model.init_args.optimizer.warmup_steps",
        "1",
    ),
    ppo=(
        "--model.init_args.max_rollouts",
        "2",
        "--data.init_args.batch_size",
        "8",
        "--model.init_args.ppo.minibatch_size",
        "4",
        "--model.init_args.ppo.epochs",
        "1",
    ),
    pref_prompts=32,
    eval_prompts=16,
    max_new_tokens=16,
    dpo=(
        "--trainer.max_steps",
        "2",
        "--data.init_args.batch_size",
        "8",
        "--model.init_args.optimizer.warmup_steps",
        "1",
    ),
    checkpoint_every=1,
    bon_prompts=8,
    bon_n_max=4,
)


@dataclass(frozen=True)
class Paths:
    """Where every artifact of a run goes, under one root."""

    root: Path

    def dir(self, name: str) -> Path:
        """One of :data:`STAGE_DIRS` under the root."""
        if name not in STAGE_DIRS:
            raise ValueError(f"{name!r} is not one of the pipeline's folders {STAGE_DIRS}")
        return self.root / name

    def model(self, stage: str) -> Path:
        """The Hugging Face export of ``stage`` (``sft``, ``reward_model``, ``ppo``, ``ppo_kl0``, ``dpo/beta_0.1``)."""
        return self.root / stage / "model"

    @property
    def checkpoints(self) -> Path:
        """Where the PPO run's ``RolloutCheckpoint`` writes ``rollout=<n>.ckpt``."""
        return self.root / "ppo" / "checkpoints"

    def run(self, stage: str) -> Path:
        """The TensorBoard run of ``stage`` (stage folders are cleared first, so it is version_0)."""
        return self.root / stage / "version_0"


def reward_model_format(config: Path) -> str:
    """``data.init_args.format`` of the RM config: ``rankings`` makes the preference stage also write
    ranking records of its samples, the RM's training data (DPO keeps the pairs)."""
    import yaml

    with open(config, encoding="utf-8") as f:
        return str(yaml.safe_load(f)["data"]["init_args"].get("format", "fields"))


def ppo_init_args(config: Path) -> dict:
    """``model.init_args`` of the PPO config: the settings the demo's other stages must match."""
    import yaml

    with open(config, encoding="utf-8") as f:
        return yaml.safe_load(f)["model"]["init_args"]


def ppo_sampling(config: Path, budget: Budget) -> tuple[float, int]:
    """``(temperature, max_new_tokens)`` PPO samples with: the evaluation must use the same."""
    sampling = ppo_init_args(config).get("sampling", {})
    temperature = float(sampling.get("temperature", 1.0))
    max_new_tokens = budget.max_new_tokens or int(sampling.get("max_new_tokens", 64))
    return temperature, max_new_tokens


def ppo_unfinished(config: Path) -> str:
    """How PPO's reward model reads a cut response (``reward.unfinished``): best-of-N picks the same way."""
    reward = ppo_init_args(config).get("reward") or {}
    return str(reward.get("unfinished", "as_sampled"))


def ppo_rollouts(config: Path, budget: Budget) -> int:
    """How many rollouts the PPO run makes: the budget's override, else the config's ``max_rollouts``."""
    flag = "--model.init_args.max_rollouts"
    if flag in budget.ppo:
        return int(budget.ppo[budget.ppo.index(flag) + 1])
    return int(ppo_init_args(config)["max_rollouts"])


def parse_betas(text: str) -> tuple[float, ...]:
    """``"0.05,0.1"`` -> ``(0.05, 0.1)``: distinct positive floats, in the given order."""
    try:
        betas = tuple(dict.fromkeys(float(part) for part in text.split(",") if part.strip()))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated numbers, e.g. 0.05,0.1") from None
    if not betas or min(betas) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more betas > 0")
    return betas


def dpo_stage(beta: float) -> str:
    """The stage (and folder below ``<out>``) of the DPO run with ``beta``: ``dpo/beta_0.1``."""
    return f"dpo/beta_{beta:g}"


def best_of_n_command(
    args: argparse.Namespace, budget: Budget, paths: Paths, temperature: float, max_new_tokens: int
) -> list[str]:
    """``rlhf-lit best-of-n`` from the SFT model against the RM on the first held-out prompts.

    The prompts are written to ``<out>/best_of_n/prompts.jsonl`` (JSONL: an opening may hold a
    line break), the same openings the evaluation uses, sampled at the temperature and length PPO
    samples with; the RM reads cut responses as PPO's does (``reward.unfinished``).
    """
    from demo.story_prompts import RANGES, load_prompts

    start, count = RANGES["eval"]
    count = min(count, budget.bon_prompts or budget.eval_prompts or count)
    _, prompts = load_prompts(args.paragraphs, start, count, 8)
    prompts_file = paths.dir("best_of_n") / "prompts.jsonl"
    prompts_file.parent.mkdir(parents=True, exist_ok=True)
    prompts_file.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")
    return rlhf_lit_command(
        [
            "best-of-n",
            "--policy",
            str(paths.model("sft")),
            "--reward-model",
            str(paths.model("reward_model")),
            "--prompts",
            str(prompts_file),
            "--judge",
            args.judge,
            "--n-max",
            str(budget.bon_n_max),
            "--temperature",
            str(temperature),
            "--max-new-tokens",
            str(max_new_tokens),
            "--seed",
            str(args.seed or 0),
            "--unfinished",
            ppo_unfinished(Path(args.config_dir) / "ppo.yaml"),
            "--out",
            str(paths.dir("best_of_n") / "best_of_n.json"),
        ]
    )


def claim_out(root: Path) -> None:
    """Make ``root`` the demo's folder and clear what an earlier demo run left in it.

    A missing or empty ``root`` is created and marked with :data:`MARKER`. A non-empty one must
    carry the marker (an earlier run made it): only then are the :data:`STAGE_DIRS` and
    :data:`RESULTS` under it removed. Anything else in it is left alone.

    Raises:
        NotADemoFolder: ``root`` is a file, or holds entries and no marker.
    """
    state = directory_state(root, MARKER, follow_symlinks=True)  # a link to a folder: written into, not swapped
    if state == "not_a_directory":
        raise NotADemoFolder(f"refusing --out {root}: it is a file, not a folder")
    if state == "foreign":
        raise NotADemoFolder(
            f"refusing to clear --out {root}: it is not empty and has no {MARKER} (the demo did not create it); "
            "give a new or empty folder"
        )
    claim_directory(
        root,
        MARKER,
        json.dumps(
            {"written_by": "python -m demo.pipeline", "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        )
        + "\n",
    )
    # a rerun replaces the previous run, and TensorBoard runs stay version_0
    clear_owned_entries(root, MARKER, (*STAGE_DIRS, RESULTS))

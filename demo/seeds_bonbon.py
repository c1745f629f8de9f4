"""The sampling runs of ``python -m demo seeds``: BoNBoN's pairs and the best-of-N sweep, one per seed.

Both are ``rlhf-lit best-of-n`` from the demo's SFT model, picked by the demo's reward model read as PPO's
reward reads a cut response (``--unfinished``, from ``configs/demo/ppo.yaml``), at the temperature and length
every policy is evaluated with; ``--seed`` is the study's seed.

- BoNBoN's pairs (:func:`pairs_command`): N samples per TRAINING prompt (``<demo>/data/<source>.txt``, read as
  PPO's data module reads it: the first 8 words of each paragraph; never a held-out prompt), the best and
  the worst of each prompt's N written by ``--pairs-out`` with N recorded;
- the best-of-N sweep (:func:`sweep_command`): N = 1 ... ``n_max`` on the first held-out prompts, the demo's
  own sweep (``demo.pipeline``) on another seed.

:func:`sampling_compute` reads what a run drew back from its ``--out`` JSON: samples drawn and reward-model
passes (one per sample; its ``config``), the numbers the study's compute table adds up.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from demo.plan import FULL, ROOT, ppo_sampling, ppo_unfinished
from demo.story_prompts import RANGES, load_prompts
from rlhf_lit.child_runs import rlhf_lit_command
from rlhf_lit.integrity import check_json_file

PROMPT_SOURCES = ("ppo", "reward_model")
"""The demo's training ranges BoNBoN's prompts may come from (``<demo>/data/<name>.txt``), never ``eval``."""
PPO_CONFIG = ROOT / "configs" / "demo" / "ppo.yaml"


def parse_ns(text: str) -> tuple[int, ...]:
    """``"4,8,16"`` -> ``(4, 8, 16)``: distinct integers >= 2 (a best and a worst), in the given order."""
    try:
        ns = tuple(dict.fromkeys(int(part) for part in text.split(",") if part.strip()))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated integers, e.g. 4,8,16") from None
    if not ns or min(ns) < 2:
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more N >= 2 (a best and a worst of N)")
    return ns


def parse_sources(text: str) -> tuple[str, ...]:
    """``"ppo"`` or ``"ppo,reward_model"`` -> the demo's training ranges BoNBoN's prompts come from, in order."""
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [name for name in names if name not in PROMPT_SOURCES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give one or more of {', '.join(PROMPT_SOURCES)} (the demo's training prompt ranges)"
        )
    return names


def training_prompts(demo: Path, sources: tuple[str, ...], folder: Path) -> Path:
    """The paragraphs of ``sources`` (``<demo>/data/<name>.txt``) as one paragraphs file in ``folder``, or the
    one file itself: what ``--prompts`` with ``--prompt-format paragraphs`` reads."""
    if len(sources) == 1:
        return demo / "data" / f"{sources[0]}.txt"
    path = folder / "prompts.txt"
    texts = [(demo / "data" / f"{name}.txt").read_text(encoding="utf-8").strip() for name in sources]
    path.write_text("\n\n".join(texts) + "\n", encoding="utf-8")
    return path


def _best_of_n(demo: Path, seed: int, max_new_tokens: int, out: Path) -> list[str]:
    """``rlhf-lit best-of-n`` from the demo's SFT model by its reward model, the study's sampling and seed."""
    return rlhf_lit_command(
        [
            "best-of-n",
            "--policy",
            str(demo / "sft" / "model"),
            "--reward-model",
            str(demo / "reward_model" / "model"),
            "--temperature",
            str(ppo_sampling(PPO_CONFIG, FULL)[0]),
            "--max-new-tokens",
            str(max_new_tokens),
            "--seed",
            str(seed),
            "--unfinished",
            ppo_unfinished(PPO_CONFIG),
            "--device",
            "cpu",
            "--out",
            str(out),
        ]
    )


def pairs_command(demo: Path, prompts: Path, n: int, seed: int, max_new_tokens: int, folder: Path) -> list[str]:
    """BoNBoN's pairs: N samples per training prompt of ``prompts`` (paragraphs), the best and the worst of
    each into ``<folder>/pairs.jsonl``, the sweep's result into ``<folder>/pairs_best_of_n.json``."""
    return [
        *_best_of_n(demo, seed, max_new_tokens, folder / "pairs_best_of_n.json"),
        "--prompts",
        str(prompts),
        "--prompt-format",
        "paragraphs",
        "--n",
        str(n),
        "--pairs-out",
        str(folder / "pairs.jsonl"),
    ]


def sweep_command(
    demo: Path, paragraphs: str, count: int, n_max: int, seed: int, max_new_tokens: int, folder: Path, judge: str
) -> list[str]:
    """The best-of-N sweep N = 1, 2, 4, ... ``n_max`` on the first ``count`` held-out prompts (the demo's
    evaluation range of ``paragraphs``), judged by ``judge``, into ``<folder>/best_of_n.json``."""
    start, _ = RANGES["eval"]
    _, prompts = load_prompts(paragraphs, start, count, 8)
    prompts_file = folder / "prompts.jsonl"  # JSONL: an opening may hold a line break
    prompts_file.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")
    return [
        *_best_of_n(demo, seed, max_new_tokens, folder / "best_of_n.json"),
        "--prompts",
        str(prompts_file),
        "--judge",
        judge,
        "--n-max",
        str(n_max),
    ]


def sampling_compute(result_path: Path) -> dict:
    """``{"prompts", "samples", "rm_passes"}`` of a ``rlhf-lit best-of-n`` run from its ``--out`` JSON: every
    sample drawn is read once by the reward model."""
    config = check_json_file(result_path, want_object=False)["config"]
    samples = int(config["num_prompts"]) * int(config["num_samples"])
    return {"prompts": int(config["num_prompts"]), "samples": samples, "rm_passes": samples}

"""How much does a reward model reward length? Score the held-out preference pairs with one or more RMs.

Each reward-model export is scored on the pairs its training held out: the pair data is read by the
library's own :class:`rlhf_lit.data.PreferenceDataModule` with the options the training run had
(``--train-path``, ``--format``, ``--hh-render``, ``--val-fraction``, ``--seed``, ``--max-records``,
``--max-length``, ``--max-prompt-length``; the defaults are configs/smollm2_hh/reward_model.yaml's data
options at GPU scale, see below), tokenized with the RM's own tokenizer, so the validation split is
exactly the one training held out and every sequence is the one the RM was validated on (prompt +
response + EOS, cut as training cut it). Give the same options the training run had: a different
``--seed``, ``--val-fraction`` or ``--max-records`` holds out other records (some of them trained on).

For every pair both sequences are scored with the RM's normalised reward
(:func:`rlhf_lit.models.reward_ensemble.reward_scores`: the head at the last real token plus the
export's unfolded offset; an ensemble directory scores its members' mean), in batches of
``--batch-size`` pairs, on CUDA when there is one (``--device``), under bfloat16 autocast with
``--bf16``. A response's length is counted in the RM's tokens: the real tokens of the sequence minus
the pair's ``prompt_length`` (so the EOS the data module appends counts; a cut response has none).

Written per RM (figures computed here in float64 numpy from the raw scores and lengths, not with
library helpers):

- ``n_pairs``: held-out pairs scored (those whose responses keep a token after truncation);
- ``accuracy``: fraction of pairs with score(chosen) > score(rejected) (a tie counts as wrong);
- ``pearson_score_length``: Pearson correlation of score with response length over the 2 * n_pairs
  responses, chosen and rejected pooled (the length bias ODIN-style training aims to remove);
- ``pearson_margin_length_diff``: Pearson correlation, over pairs, of score(chosen) - score(rejected)
  with len(chosen) - len(rejected);
- ``rm_prefers_longer``: over the pairs whose two responses differ in length (``n_unequal_length``),
  the fraction where the RM scores the longer one higher (a score tie counts as not);
- ``human_prefers_longer``: over the same pairs, the fraction where the chosen one is the longer one
  (a property of the data, the same for every RM with the same tokenizer);
- ``score_mean`` / ``score_std`` (population) and ``length_mean`` of the pooled responses,
  ``accuracy_longer_chosen`` / ``accuracy_shorter_chosen``: the accuracy on the unequal-length pairs
  whose chosen response is the longer / the shorter one;
- ``pairs`` (unless ``--no-pairs``): the raw per-pair ``chosen_score``, ``rejected_score``,
  ``chosen_length``, ``rejected_length`` lists, in the validation set's order.

Command (from the project root; several RMs as ``NAME=DIR`` or plain directories)::

    python bench/rm_length_bias.py plain=runs/plain/reward_model/model odin=runs/odin/reward_model/model \\
        --val-fraction 0.2 --seed 0 --max-length 512 --max-prompt-length 384 --bf16 --out rm_length_bias.json

prints one line per RM and writes the JSON (``{"config", "environment", "reward_models": {name: {...}}}``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

DEFAULTS = {
    "train_path": "assets/data/hh-rlhf/harmless-base-test.jsonl.gz",
    "format": "hh_rlhf",
    "hh_render": "auto",
    "val_fraction": 0.2,
    "seed": 0,
    "max_records": None,
    "max_length": 512,
    "max_prompt_length": 384,
}
"""The pair data of the GPU study (bench/gpu/odin_study.sh): configs/smollm2_hh/reward_model.yaml's
file, format and rendering, all 2312 records, 20% held out by seed 0, 512 / 384 tokens."""


def pearson(x: np.ndarray, y: np.ndarray) -> float | None:
    """Pearson's r of two equal-length float64 vectors; None when fewer than 2 values or one is constant."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.size < 2:
        return None
    dx, dy = x - x.mean(), y - y.mean()
    sxx, syy = float(np.dot(dx, dx)), float(np.dot(dy, dy))
    if sxx == 0.0 or syy == 0.0:
        return None
    return float(np.dot(dx, dy)) / math.sqrt(sxx * syy)


def length_bias(chosen: np.ndarray, rejected: np.ndarray, chosen_len: np.ndarray, rejected_len: np.ndarray) -> dict:
    """The figures of the module docstring from per-pair scores and response lengths (float64)."""
    chosen, rejected = np.asarray(chosen, np.float64), np.asarray(rejected, np.float64)
    chosen_len, rejected_len = np.asarray(chosen_len, np.float64), np.asarray(rejected_len, np.float64)
    n = int(chosen.size)
    scores, lengths = np.concatenate([chosen, rejected]), np.concatenate([chosen_len, rejected_len])
    unequal = chosen_len != rejected_len
    longer_chosen = unequal & (chosen_len > rejected_len)
    shorter_chosen = unequal & (chosen_len < rejected_len)
    correct = chosen > rejected
    # The RM prefers the longer response: its score is strictly higher on the longer one.
    rm_longer = np.where(chosen_len > rejected_len, chosen > rejected, rejected > chosen)
    frac = lambda mask, of: float(mask[of].mean()) if of.any() else None  # noqa: E731
    return {
        "n_pairs": n,
        "accuracy": float(correct.mean()) if n else None,
        "pearson_score_length": pearson(scores, lengths),
        "pearson_margin_length_diff": pearson(chosen - rejected, chosen_len - rejected_len),
        "n_unequal_length": int(unequal.sum()),
        "rm_prefers_longer": frac(rm_longer, unequal),
        "human_prefers_longer": frac(longer_chosen, unequal),
        "accuracy_longer_chosen": frac(correct, longer_chosen),
        "accuracy_shorter_chosen": frac(correct, shorter_chosen),
        "score_mean": float(scores.mean()) if n else None,
        "score_std": float(scores.std()) if n else None,
        "length_mean": float(lengths.mean()) if n else None,
        "chosen_length_mean": float(chosen_len.mean()) if n else None,
        "rejected_length_mean": float(rejected_len.mean()) if n else None,
    }


TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
)


def tokenizer_key(path: str) -> str:
    """A digest of the tokenizer files in ``path``: RMs with the same key read the same token ids."""
    digest = hashlib.sha256()
    for name in TOKENIZER_FILES:
        file = Path(path) / name
        if file.is_file():
            digest.update(name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def held_out_pairs(tokenizer, args, cache: dict | None = None, key: str | None = None):
    """The set-up :class:`~rlhf_lit.data.PreferenceDataModule` (the RM's tokenizer, the run's data options);
    one per tokenizer (``cache`` by ``key``): RMs with the same tokenizer files share the encoded pairs."""
    from rlhf_lit.data import PreferenceDataModule

    if cache is not None and key in cache:
        return cache[key]

    data = PreferenceDataModule(
        tokenizer=tokenizer,
        train_path=args.train_path,
        format=args.format,
        hh_render=args.hh_render,
        val_fraction=args.val_fraction,
        seed=args.seed,
        max_records=args.max_records,
        max_length=args.max_length,
        max_prompt_length=args.max_prompt_length,
        batch_size=args.batch_size,
    )
    data.setup("fit")
    if not data.val_dataset:
        raise ValueError(f"{args.train_path}: no held-out pairs (val_fraction {args.val_fraction})")
    if cache is not None:
        cache[key] = data
    return data


@torch.no_grad()
def score_pairs(path: str, args, device: torch.device, cache: dict | None = None) -> tuple[dict, dict]:
    """Score every held-out pair with the RM at ``path``: (raw per-pair lists, facts about the run);
    ``cache`` keeps the encoded pairs per tokenizer for the next RM."""
    from rlhf_lit.models.reward_ensemble import load_any_reward_model, reward_scores
    from rlhf_lit.tokenizer import load_tokenizer

    t0 = time.perf_counter()
    tokenizer = load_tokenizer(path, padding_side="right")  # preference batches are right padded
    data = held_out_pairs(tokenizer, args, cache, tokenizer_key(path))
    model = load_any_reward_model(path, tokenizer).to(device).eval()
    t_loaded = time.perf_counter()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if args.bf16 else nullcontext()
    out: dict[str, list] = {"chosen_score": [], "rejected_score": [], "chosen_length": [], "rejected_length": []}
    for batch in data.val_dataloader():
        prompt_length = batch["prompt_length"]
        for side in ("chosen", "rejected"):
            ids, mask = batch[f"{side}_input_ids"].to(device), batch[f"{side}_attention_mask"].to(device)
            with autocast:
                scores = reward_scores(model, ids, mask)
            out[f"{side}_score"] += scores.float().cpu().tolist()
            out[f"{side}_length"] += (batch[f"{side}_attention_mask"].sum(1) - prompt_length).tolist()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    facts = {
        "path": path,
        "val_records": data.stats.get("val_records"),
        "val_dropped": data.stats.get("val_dropped"),
        "train_records": data.stats.get("train_records"),
        "chat_rendered": bool(data.chat_rendered),
        "timing_s": {"load": t_loaded - t0, "score": time.perf_counter() - t_loaded},
    }
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out, facts


def named(spec: str) -> tuple[str, str]:
    """``NAME=DIR`` -> (NAME, DIR); a plain ``DIR`` is named by its path."""
    name, sep, path = spec.partition("=")
    return (name, path) if sep and name and not Path(spec).exists() else (spec, spec)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("reward_models", nargs="+", metavar="[NAME=]DIR", help="reward-model export directories")
    p.add_argument("--train-path", default=DEFAULTS["train_path"])
    p.add_argument("--format", default=DEFAULTS["format"])
    p.add_argument("--hh-render", default=DEFAULTS["hh_render"], choices=("auto", "always", "never"))
    p.add_argument("--val-fraction", type=float, default=DEFAULTS["val_fraction"])
    p.add_argument("--seed", type=int, default=DEFAULTS["seed"], help="the data module's seed (the split's)")
    p.add_argument("--max-records", type=int, default=DEFAULTS["max_records"], help="default: all records")
    p.add_argument("--max-length", type=int, default=DEFAULTS["max_length"])
    p.add_argument("--max-prompt-length", type=int, default=DEFAULTS["max_prompt_length"])
    p.add_argument("--batch-size", type=int, default=32, help="pairs per forward (each side scored apart)")
    p.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda, cuda:1, ...")
    p.add_argument("--bf16", action="store_true", help="score under torch.autocast(bfloat16)")
    p.add_argument("--no-pairs", action="store_true", help="leave the per-pair scores and lengths out of the JSON")
    p.add_argument("--out", type=Path, default=None, help="JSON file (default: print only)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else "cpu"
        if args.device == "auto"
        else args.device
    )
    config = {k: getattr(args, k) for k in DEFAULTS} | {
        "batch_size": args.batch_size,
        "device": str(device),
        "bf16": args.bf16,
    }
    result: dict = {
        "config": config,
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda_device": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        },
        "reward_models": {},
    }
    cache: dict = {}
    for spec in args.reward_models:
        name, path = named(spec)
        if name in result["reward_models"]:
            raise SystemExit(f"rm_length_bias: the name {name!r} is given twice")
        pairs, facts = score_pairs(path, args, device, cache)
        figures = length_bias(
            **{
                k: np.asarray(v)
                for k, v in (
                    ("chosen", pairs["chosen_score"]),
                    ("rejected", pairs["rejected_score"]),
                    ("chosen_len", pairs["chosen_length"]),
                    ("rejected_len", pairs["rejected_length"]),
                )
            }
        )
        entry = {**figures, **facts}
        if not args.no_pairs:
            entry["pairs"] = pairs
        result["reward_models"][name] = entry
        fmt = lambda v: "n/a" if v is None else f"{v:.4f}"  # noqa: E731
        print(
            f"{name}: n_pairs {figures['n_pairs']}  accuracy {fmt(figures['accuracy'])}  "
            f"r(score, length) {fmt(figures['pearson_score_length'])}  "
            f"r(margin, length diff) {fmt(figures['pearson_margin_length_diff'])}  "
            f"RM prefers longer {fmt(figures['rm_prefers_longer'])}  "
            f"human prefers longer {fmt(figures['human_prefers_longer'])}  "
            f"({facts['timing_s']['score']:.1f} s)",
            flush=True,
        )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

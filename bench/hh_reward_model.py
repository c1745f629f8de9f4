"""A reward model on human labels: SmolLM2-135M-Instruct trained on the shipped HH-RLHF harmless-base
pairs, its held-out pair accuracy beside a length-only baseline on the same pairs.

    OMP_NUM_THREADS=2 .venv/bin/python bench/hh_reward_model.py [--model DIR] [--out runs/hh_rm] [--extra ...]

The training is one ``rlhf-lit fit`` of ``configs/smollm2_hh/reward_model.yaml`` (the transcripts rendered
as conversations with the model's ChatML template) over the whole file instead of its first 600 records:
``--held-out`` pairs (400 by default) are held out by the data module's seeded split (``val_fraction``,
``seed: 0``), the rest trained on for ``--epochs``, every held-out pair scored at the end. ``--extra``
options go to the fit as they are (e.g. ``--model.init_args.trainable_layers 8``).

The length baseline is read off the same held-out pairs as the data module encodes them: the response
with more tokens wins (a tie counts one half). Both accuracies come with their binomial standard error
``sqrt(a (1 - a) / n)``; at chance, 400 pairs give 0.025, so 0.58 is 3.2 standard errors above 0.5.

The training's tokens per second (every token of every chosen and rejected sequence, forward and
backward, over the fit's wall time) give what one epoch of the hub data would take here, and, from the
FLOPs it needs (6 x parameters x tokens), on one GPU at a stated throughput. Writes
``bench/results/hh-reward-model-<UTC date>.json`` and prints a markdown summary.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
from pathlib import Path

from results_file import write_result

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the demo's package, beside rlhf_lit in a clone
CONFIG = ROOT / "configs" / "smollm2_hh" / "reward_model.yaml"
HH = ROOT / "assets" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
HUB_PAIRS = 160_800
"""Anthropic/hh-rlhf's training pairs (all four subsets), the full epoch the docs size."""
GPU_TFLOPS = 200.0
"""An assumed sustained bf16 throughput of one recent data-centre GPU (about a third of an H100's dense peak)."""


def binomial_se(accuracy: float, n: int) -> float:
    """The standard error of an accuracy measured on ``n`` independent pairs."""
    return math.sqrt(accuracy * (1 - accuracy) / n)


def held_out_pairs(model: str, held_out: int) -> tuple[list[dict], float, int]:
    """The held-out pairs as the data module encodes them (its own seeded split), the ``val_fraction``
    that holds out ``held_out`` of the file's usable pairs, and the number of training pairs."""
    from rlhf_lit.data import PreferenceDataModule
    from rlhf_lit.tokenizer import load_tokenizer

    def module(fraction: float) -> PreferenceDataModule:
        data = PreferenceDataModule(
            tokenizer=load_tokenizer(model),
            train_path=str(HH),
            format="hh_rlhf",
            hh_render="auto",
            val_fraction=fraction,
            seed=0,
            max_length=256,
            max_prompt_length=192,
        )
        data.setup("fit")
        return data

    # The split draws record positions (docs/data.md), and the format skips a few records wherever they
    # fall: start from the share of the usable pairs and widen it until at least held_out pairs are kept.
    usable = len(module(0.5).train_dataset) * 2  # round(0.5 n) each side: the usable pairs, within one
    fraction = held_out / usable
    data = module(fraction)
    while len(data.val_dataset) < held_out:
        fraction += (held_out - len(data.val_dataset)) / usable
        data = module(fraction)
    return list(data.val_dataset), fraction, len(data.train_dataset)


def length_baseline(pairs: list[dict]) -> float:
    """The share of pairs whose chosen response has more tokens than the rejected one (a tie: one half)."""
    wins = 0.0
    for pair in pairs:
        chosen = len(pair["chosen_input_ids"]) - pair["prompt_length"]
        rejected = len(pair["rejected_input_ids"]) - pair["prompt_length"]
        wins += 1.0 if chosen > rejected else 0.5 if chosen == rejected else 0.0
    return wins / len(pairs)


def last_scalars(run: Path) -> dict[str, float]:
    """The last value of every scalar logged in the TensorBoard run under ``run``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    values = {}
    for events in sorted(run.rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            values[tag] = acc.Scalars(tag)[-1].value
    return values


def main(argv: list[str] | None = None) -> int:
    """Train, measure, write the JSON; prints the summary."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="SmolLM2-135M-Instruct folder (default: make smollm2's cache)")
    p.add_argument("--out", default="runs/hh_rm", help="the fit's run folder (a new version_N each run)")
    p.add_argument("--held-out", type=int, default=400, help="held-out pairs")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=3e-5, help="the full fine-tune's learning rate")
    p.add_argument("--batch-size", type=int, default=16, help="pairs per step")
    p.add_argument(
        "--precision", default="bf16-mixed", help="trainer.precision (bf16-mixed pays on a CPU with AMX; else 32-true)"
    )
    p.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more options for rlhf-lit fit")
    args = p.parse_args(argv)
    from demo.chat_plan import fetched_model

    model = args.model or fetched_model()
    pairs, fraction, n_train = held_out_pairs(model, args.held_out)
    tokens = sum(len(p["chosen_input_ids"]) + len(p["rejected_input_ids"]) for p in pairs)  # held-out tokens
    out = Path(args.out)
    cmd = [sys.executable, "-m", "rlhf_lit.cli", "fit", "--config", str(CONFIG), "--model.init_args.model", model]
    cmd += ["--trainer.logger", "lightning.pytorch.loggers.TensorBoardLogger", "--trainer.logger.save_dir", str(out)]
    cmd += [
        "--trainer.max_steps",
        "-1",
        "--trainer.max_epochs",
        str(args.epochs),
        "--trainer.val_check_interval",
        "1.0",
    ]
    cmd += [
        "--trainer.limit_val_batches",
        "1.0",
        "--trainer.callbacks",
        "[]",
        "--trainer.enable_checkpointing",
        "false",
    ]
    cmd += ["--data.init_args.max_records", "null", "--data.init_args.val_fraction", repr(fraction)]
    cmd += ["--data.init_args.batch_size", str(args.batch_size), "--model.init_args.optimizer.lr", repr(args.lr)]
    cmd += ["--trainer.precision", args.precision]
    cmd += ["--model.init_args.export_dir", str(out / "model"), "--model.init_args.export_existing", "replace"]
    cmd += ["--run_dir", "null", *args.extra]
    print("$", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True)
    seconds = time.perf_counter() - t0
    logged = last_scalars(out)
    accuracy = logged["val/accuracy"]
    n = len(pairs)
    train_tokens = tokens / n * n_train * args.epochs  # the held-out pairs' mean length stands for the training pairs'
    per_second = train_tokens / seconds
    params = 134_515_008
    result = {
        "fit_command": " ".join(cmd),
        "held_out_pairs": n,
        "train_pairs": n_train,
        "epochs": args.epochs,
        "rm_accuracy": accuracy,
        "rm_accuracy_se": binomial_se(accuracy, n),
        "length_baseline": length_baseline(pairs),
        "length_baseline_se": binomial_se(length_baseline(pairs), n),
        "chance_se": binomial_se(0.5, n),
        "fit_seconds": seconds,
        "train_tokens_per_second": per_second,
        "hub_epoch_hours_here": HUB_PAIRS * (tokens / n) / per_second / 3600,
        "hub_epoch_hours_one_gpu": 6 * params * HUB_PAIRS * (tokens / n) / (GPU_TFLOPS * 1e12) / 3600,
        "logged": logged,
    }
    path = write_result("hh-reward-model", result)
    print(
        f"held-out pair accuracy {accuracy:.3f} +- {result['rm_accuracy_se']:.3f} on {n} pairs "
        f"(length baseline {result['length_baseline']:.3f} +- {result['length_baseline_se']:.3f}); "
        f"fit {seconds / 60:.1f} min; {per_second:.0f} tokens/s; written to {path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

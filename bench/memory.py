"""Peak memory (RSS) and time per rollout of the offline PPO config, per LoRA / memory-lever variant.

Each variant runs in a fresh process (``ru_maxrss`` is a per-process high-water mark): the offline
PPO config (configs/offline/ppo.yaml: 32 prompts a rollout, 32 new tokens, 4 epochs of
minibatches of 8, separate critic) for ``--rollouts`` rollouts, without its callbacks and judge.
The policy and reference start from ``--sft`` and the RM / critic from ``--rm``; by default the
offline exports (logs/offline/{sft,reward_model}/model, made by configs/offline/{sft,reward_model}.yaml) when they
exist, else stories260K with a reward model built from it (same architecture and size).
s/rollout is the wall time between the end of the first and of the last rollout over
``rollouts - 1`` (model loading and the first rollout excluded).

"to host at teardown" is what Lightning's ``Strategy.teardown`` (after training, before the export)
copies to host memory on an accelerator: the LightningModule's registered weights and the optimizer
states (``rlhf_lit.models.memory.teardown_bytes``), counted when it runs. On a CPU run nothing is
copied, so the RSS column does not show it; on a GPU it adds to the host RSS at the end of the run.
The variant ``released nothing at fit end (before #28)`` skips ``StageModule.release_after_fit``.

Command (from the project root; one torch thread):

    OMP_NUM_THREADS=1 .venv/bin/python bench/memory.py --rollouts 4
    OMP_NUM_THREADS=1 .venv/bin/python bench/memory.py --rollouts 3 --scale 512,8 --batch-size 16

prints one markdown table row per variant. At 260K parameters the RSS is mostly the Python, torch
and transformers runtime; ``--scale`` builds random-init models of the same architecture, big
enough (512 wide, 8 layers: 25M parameters) for weights and optimizer states to show.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STORIES = ROOT / "assets" / "models" / "stories260K"

VARIANTS: dict[str, list[str]] = {
    "full (32-true)": [],
    "lora r8": ["--model.init_args.lora.r", "8"],
    "gradient checkpointing": ["--model.init_args.memory.gradient_checkpointing", "true"],
    "lora r8 + gradient checkpointing": [
        "--model.init_args.lora.r",
        "8",
        "--model.init_args.memory.gradient_checkpointing",
        "true",
    ],
    "frozen models bf16": ["--model.init_args.memory.frozen_dtype", "bfloat16"],
    "frozen models on cpu": ["--model.init_args.memory.frozen_device", "cpu"],
    "score_chunk_size 8": ["--model.init_args.ppo.score_chunk_size", "8"],
    "all levers (lora, checkpointing, frozen bf16, chunks 8)": [
        "--model.init_args.lora.r",
        "8",
        "--model.init_args.memory.gradient_checkpointing",
        "true",
        "--model.init_args.memory.frozen_dtype",
        "bfloat16",
        "--model.init_args.ppo.score_chunk_size",
        "8",
    ],
    "bf16-mixed precision": ["--trainer.precision", "bf16-mixed"],
    "released nothing at fit end (before #28)": ["KEEP_AFTER_FIT"],
}

KEEP_AFTER_FIT = "KEEP_AFTER_FIT"
"""Not a CLI flag: the variant whose run skips ``release_after_fit`` (the frozen models and the
optimizer states reach the teardown: the memory that release saves)."""


def _scaled_model(work: Path, scale: str) -> str:
    """A randomly initialised stories260K-architecture Llama of ``hidden,layers`` (its tokenizer):
    big enough that weights, optimizer states and activations, not the runtime, dominate RSS."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    hidden, layers = (int(x) for x in scale.split(","))
    config = AutoConfig.from_pretrained(STORIES)
    config.update(
        {
            "hidden_size": hidden,
            "num_hidden_layers": layers,
            "intermediate_size": hidden * 8 // 3,
            "num_attention_heads": hidden // 64,
            "num_key_value_heads": hidden // 64,
            "head_dim": 64,
        }
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(work / "sft")
    AutoTokenizer.from_pretrained(STORIES).save_pretrained(work / "sft")
    return str(work / "sft")


def _models(work: Path, scale: str | None = None) -> tuple[str, str]:
    sft, rm = ROOT / "logs/offline/sft/model", ROOT / "logs/offline/reward_model/model"
    if scale is None and sft.is_dir() and rm.is_dir():
        return str(sft), str(rm)
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    base = _scaled_model(work, scale) if scale else str(STORIES)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1)
    model.save_pretrained(work / "rm")
    AutoTokenizer.from_pretrained(base).save_pretrained(work / "rm")
    return base, str(work / "rm")


def run_variant(args: argparse.Namespace) -> None:
    """In this process: fit, then print {"rss_mib", "s_per_rollout"} as the last line."""
    from lightning.pytorch.callbacks import Callback

    from rlhf_lit import cli

    stamps: list[float] = []

    class Stamps(Callback):
        def on_train_batch_end(self, *a, **k):
            stamps.append(time.perf_counter())

    # The CLI builds its own Trainer: add the timing callback through the Trainer's constructor.
    import lightning.pytorch as pl

    original = pl.Trainer.__init__

    @functools.wraps(original)  # the CLI reads the Trainer's signature through __wrapped__
    def init(self, *a, callbacks=None, **k):
        original(self, *a, callbacks=[*(callbacks or []), Stamps()], **k)

    pl.Trainer.__init__ = init
    teardown: dict[str, int] = {}
    spy_on_teardown(teardown)
    flags = json.loads(args.flags)
    if KEEP_AFTER_FIT in flags:
        from rlhf_lit.stages.base import StageModule

        flags.remove(KEEP_AFTER_FIT)
        StageModule.release_after_fit = lambda self: None
    out = Path(args.work)
    cli.main(
        [
            "fit",
            "--config",
            str(ROOT / "configs/offline/ppo.yaml"),
            "--run_dir",
            "null",  # outputs set below
            "--trainer.callbacks",
            "[]",
            "--trainer.logger.init_args.save_dir",
            str(out / "tb"),
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.enable_checkpointing",
            "false",
            "--trainer.default_root_dir",
            str(out),
            "--model.init_args.sft_model",
            args.sft,
            "--model.init_args.reward_model",
            args.rm,
            "--model.init_args.judge",
            "null",
            "--model.init_args.max_rollouts",
            str(args.rollouts),
            "--model.init_args.export_dir",
            str(out / "export"),
            *flags,
        ]
    )
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    per = (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else float("nan")
    print(json.dumps({"rss_mib": rss_mib, "s_per_rollout": per, "teardown": teardown}))


def spy_on_teardown(into: dict[str, int]) -> None:
    """Record into ``into`` the bytes Lightning's ``Strategy.teardown`` copies to the host
    (:func:`rlhf_lit.models.memory.teardown_bytes`), counted when it runs."""
    from lightning.pytorch.strategies import Strategy

    from rlhf_lit.models.memory import teardown_bytes

    original = Strategy.teardown

    def teardown(strategy) -> None:
        if strategy.lightning_module is not None:
            into.update(teardown_bytes(strategy.lightning_module, strategy.optimizers))
        original(strategy)

    Strategy.teardown = teardown


def main() -> None:
    """Run every variant (or ``--only``) in a fresh process and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--sft"), parser.add_argument("--rm")
    parser.add_argument("--only", nargs="*", help="variant names to run (default: all)")
    parser.add_argument("--scale", help="HIDDEN,LAYERS: random-init models of this size instead (e.g. 512,8)")
    parser.add_argument("--batch-size", type=int, help="prompts per rollout (default: the config's 32)")
    parser.add_argument("--flags", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.flags is not None:
        run_variant(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        sft, rm = _models(Path(tmp), args.scale)
        sft, rm = args.sft or sft, args.rm or rm
        print(
            f"sft {sft}, rm {rm}, scale {args.scale}, {args.rollouts} rollouts, torch threads {os.environ.get('OMP_NUM_THREADS')}"
        )
        print(
            "| variant | peak RSS MiB | s/rollout | to host at teardown MiB: weights + optimizer states |\n"
            "| --- | --- | --- | --- |"
        )
        for i, (name, flags) in enumerate(VARIANTS.items()):
            if args.only and name not in args.only:
                continue
            if args.batch_size:
                flags = [*flags, "--data.init_args.batch_size", str(args.batch_size)]
            cmd = [
                sys.executable,
                __file__,
                "--rollouts",
                str(args.rollouts),
                "--sft",
                sft,
                "--rm",
                rm,
                "--flags",
                json.dumps(flags),
                "--work",
                str(Path(tmp) / f"v{i}"),
            ]
            done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            if done.returncode != 0:
                print(f"| {name} | failed: {done.stderr.strip().splitlines()[-1:]} | | |")
                continue
            result = json.loads(done.stdout.strip().splitlines()[-1])
            moved = result["teardown"]
            weights, states = moved.get("module", 0) / 2**20, moved.get("optimizer_states", 0) / 2**20
            print(
                f"| {name} | {result['rss_mib']:.0f} | {result['s_per_rollout']:.2f} | "
                f"{weights + states:.1f} = {weights:.1f} + {states:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()

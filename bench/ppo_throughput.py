"""Seconds per PPO iteration of rlhf-lit's ``PPOModule``, driven by the Lightning Trainer, on the
workloads of the peer-bench harness (Hugging Face TRL's PPO and a raw-PyTorch floor; the harness is not
part of this repository: ``PEERBENCH_HARNESS`` names its folder) or on any models and prompts given in
``PEERBENCH_*`` variables (docs/performance.md runs it on the shipped stories260K).

One iteration = one rollout: generate -> the no-grad scoring passes (old logprobs, reference,
values, reward) -> advantages -> epochs x minibatches of updates -> metrics, exactly what
``rlhf-lit fit`` runs, through ``Trainer.fit``. The settings are the harness's (its README, "TRL
settings"): fixed KL coefficient 0.05 with the k1 estimator, lr 1e-5 with linear decay, Adam eps
1e-8, no gradient clipping, vf_coef 0.1, clip ranges 0.2, gamma 1, lambda 0.95, whitened
advantages, a separate critic started from the reward model, dropout off, and responses that run to
the full length (``sampling.ignore_eos``). The phases are the module's own timers (``time/*``,
also logged to TensorBoard in a real run): ``generate``, ``score`` (the scoring passes, rewards and
advantages), ``train`` (every minibatch update) and ``text`` (decoding for text metrics).

Standalone with the harness (the workload is read from its ``workloads.py``)::

    OMP_NUM_THREADS=1 .venv/bin/python bench/ppo_throughput.py --workload tiny
    OMP_NUM_THREADS=1 .venv/bin/python bench/ppo_throughput.py --workload gpt2-small --iters 3

Side by side with TRL and the floor, alternating in one run (ratios from that one run only), from the
harness's folder (``<checkout>`` is this repository)::

    bash run_all.sh --workload tiny --cycles 3 \\
        --extra "<checkout>/.venv/bin/python <checkout>/bench/ppo_throughput.py --json {json}"

Under ``run_all.sh --extra`` the workload comes from the ``PEERBENCH_*`` environment (the padded
prompt ids from ``PEERBENCH_PROMPT_IDS``). Prints the median [min .. max] of iterations 2..N (the
first is a warm-up) and writes the harness's JSON: ``iter_median_s``, ``gen_s``, ``rollout_s``
(scoring), ``train_s``, ``other_s``, ``tokens_per_s``, ``peak_rss_mib``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
HARNESS = Path(os.environ.get("PEERBENCH_HARNESS", ROOT.parent / "shared" / "peer-bench"))
ENV_KEYS = (
    "policy",
    "reward",
    "tokenizer",
    "batch",
    "prompt_len",
    "resp_len",
    "epochs",
    "minibatches",
    "iters",
    "threads",
    "temperature",
    "kl_coef",
    "seed",
    "lr",
)
INTS = {"batch", "prompt_len", "resp_len", "epochs", "minibatches", "iters", "threads", "seed"}


def workload_from_env() -> dict | None:
    """The workload ``run_all.sh --extra`` passes in ``PEERBENCH_*`` variables; None outside it."""
    if "PEERBENCH_POLICY" not in os.environ:
        return None
    w = {k: os.environ[f"PEERBENCH_{k.upper()}"] for k in ENV_KEYS}
    w = {k: int(v) if k in INTS else float(v) if k in ("temperature", "kl_coef", "lr") else v for k, v in w.items()}
    w["workload"] = os.environ.get("PEERBENCH_WORKLOAD", "custom")
    w["prompt_ids"] = os.environ.get("PEERBENCH_PROMPT_IDS")
    return w


def workload_from_harness(name: str) -> dict:
    """The named workload from the harness's ``workloads.py`` (``--harness``)."""
    sys.path.insert(0, str(HARNESS))
    from workloads import WORKLOADS  # noqa: PLC0415 (the harness is not a package)

    return dict(WORKLOADS[name], workload=name, prompt_ids=None)


def prompt_batches(w: dict, tokenizer) -> list[dict]:
    """The padded prompt rows (the harness's file, or built by its ``prompts.py``), in batches."""
    import torch

    if w.get("prompt_ids"):
        data = json.loads(Path(w["prompt_ids"]).read_text())
        rows, masks = data["input_ids"], data["attention_mask"]
    else:
        sys.path.insert(0, str(HARNESS))
        from prompts import build_prompt_ids  # noqa: PLC0415

        rows, masks = build_prompt_ids(tokenizer, w["prompt_len"])
    n = len(rows) // w["batch"] * w["batch"]
    return [
        {"input_ids": torch.tensor(rows[i : i + w["batch"]]), "attention_mask": torch.tensor(masks[i : i + w["batch"]])}
        for i in range(0, n, w["batch"])
    ]


def build_module(
    w: dict,
    iters: int,
    export_dir: str,
    old_logprobs: str = "rescore",
    decode: str = "eager",
    forward: str = "eager",
    remove_padding: bool = False,
    reuse_first_forward: bool = True,
):
    """``PPOModule`` with the harness's settings (see the module docstring)."""
    from rlhf_lit.models.generation import SamplingConfig
    from rlhf_lit.stages import PPOModule
    from rlhf_lit.stages.optim import OptimizerConfig
    from rlhf_lit.stages.ppo.config import KLConfig, PPOConfig, RewardConfig

    return PPOModule(
        sft_model=w["policy"],
        reward_model=w["reward"],
        tokenizer_path=w["tokenizer"],
        missing_pad="error",
        critic="separate",
        sampling=SamplingConfig(
            max_new_tokens=w["resp_len"], temperature=w["temperature"], ignore_eos=True, decode=decode
        ),
        ppo=PPOConfig(
            epochs=w["epochs"],
            minibatch_size=w["batch"] // w["minibatches"],
            vf_coef=0.1,
            clip_range=0.2,
            value_clip_range=0.2,
            gamma=1.0,
            lam=0.95,
            whiten_advantages=True,
            max_grad_norm=None,
            old_logprobs=old_logprobs,
            forward=forward,
            remove_padding=remove_padding,
            reuse_first_forward=reuse_first_forward,
        ),
        reward=RewardConfig(missing_eos_penalty=None),
        kl=KLConfig(kind="fixed", init_coef=w["kl_coef"], estimator="k1"),
        optimizer=OptimizerConfig(lr=w["lr"], eps=1e-8, schedule="linear"),
        max_rollouts=iters,
        rollout_seed=w["seed"],
        export_dir=export_dir,
    )


def run(
    w: dict,
    iters: int,
    accelerator: str,
    precision: str,
    out_dir: str,
    old_logprobs: str = "rescore",
    decode: str = "eager",
    forward: str = "eager",
    remove_padding: bool = False,
    reuse_first_forward: bool = True,
) -> dict:
    """Fit ``iters`` rollouts; per-iteration wall time and the module's phase timers."""
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.loggers import Logger
    from lightning.pytorch.utilities import rank_zero_only
    from torch.utils.data import DataLoader

    class Capture(Logger):
        """Keeps the logged metrics of each rollout in memory (no files)."""

        def __init__(self) -> None:
            super().__init__()
            self.rows: list[dict] = []

        name, version = "capture", 0

        @property
        def experiment(self):
            return None

        @rank_zero_only
        def log_metrics(self, metrics, step=None):
            if "time/generate_s" in metrics:
                self.rows.append(dict(metrics))

        def log_hyperparams(self, params, *args, **kwargs):
            pass

    class IterationClock(pl.Callback):
        """Wall time of each ``training_step`` (one rollout), CUDA work included."""

        def __init__(self) -> None:
            self.times: list[float] = []
            self.cpu_times: list[float] = []  # this process's CPU time: less disturbed by other processes

        def _now(self, module) -> float:
            if module.device.type == "cuda":
                torch.cuda.synchronize(module.device)
            return time.perf_counter()

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            self._start, self._cpu_start = self._now(module), time.process_time()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.times.append(self._now(module) - self._start)
            self.cpu_times.append(time.process_time() - self._cpu_start)

    pl.seed_everything(w["seed"], verbose=False)
    module = build_module(
        w,
        iters,
        export_dir=os.path.join(out_dir, "model"),
        old_logprobs=old_logprobs,
        decode=decode,
        forward=forward,
        remove_padding=remove_padding,
        reuse_first_forward=reuse_first_forward,
    )
    batches = prompt_batches(w, module.tokenizer)
    loader = DataLoader(batches * (iters // len(batches) + 1), batch_size=None, shuffle=False)
    capture, clock = Capture(), IterationClock()
    trainer = pl.Trainer(
        accelerator=accelerator,
        devices=1,
        precision=precision,
        max_epochs=-1,
        logger=[capture],
        callbacks=[clock],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=out_dir,
    )
    trainer.fit(module, train_dataloaders=loader)
    return {
        "iter_s": clock.times,
        "cpu_s": clock.cpu_times,
        "metrics": capture.rows,
        "forward_stats": module.forward_passes.stats,
    }


def summarize(result: dict, w: dict) -> dict:
    """Medians over iterations 2..N (all of them when only one ran) and the harness's JSON keys."""
    steady = slice(1, None) if len(result["iter_s"]) > 1 else slice(None)
    iters, rows = result["iter_s"][steady], result["metrics"][steady]
    phase = {
        key: [r[f"time/{name}_s"] for r in rows]
        for key, name in (("gen_s", "generate"), ("rollout_s", "score"), ("train_s", "train"), ("text_s", "text"))
    }
    tokens = w["batch"] * w["resp_len"]
    out = {
        "iter_median_s": statistics.median(iters),
        "iter_min_s": min(iters),
        "iter_max_s": max(iters),
        **{k: statistics.median(v) for k, v in phase.items()},
        "tokens_per_s": tokens / statistics.median(iters),
        "gen_tokens_per_s": tokens / statistics.median(phase["gen_s"]),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "iter_cpu_median_s": statistics.median(result["cpu_s"][steady]),
        "first_iter_s": result["iter_s"][0],
        "iters_s": result["iter_s"],
    }
    out["other_s"] = out["iter_median_s"] - sum(statistics.median(v) for v in phase.values())
    return out


def main(argv: list[str] | None = None) -> int:
    """Parse options, run, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--workload",
        choices=("tiny", "gpt2-small", "smollm2-135m"),
        default="tiny",
        help="the harness's workload (ignored under run_all.sh, which sets PEERBENCH_*)",
    )
    parser.add_argument("--iters", type=int, default=None, help="PPO iterations (default: the workload's)")
    parser.add_argument("--json", default=os.environ.get("PEERBENCH_JSON"), help="write the results here")
    parser.add_argument("--accelerator", default="cpu", help="cpu or gpu")
    parser.add_argument("--precision", default="32-true", help="the Trainer's precision, e.g. bf16-mixed on a GPU")
    parser.add_argument(
        "--old-logprobs",
        choices=("rescore", "sampling"),
        default="rescore",
        help="ppo.old_logprobs: rescore (the default, an exact ratio of 1) or sampling (TRL's way)",
    )
    parser.add_argument(
        "--decode",
        choices=("eager", "compiled"),
        default="eager",
        help="sampling.decode: eager (the default) or compiled (static KV cache, compiled decode step)",
    )
    parser.add_argument(
        "--forward",
        choices=("eager", "compiled"),
        default="eager",
        help="ppo.forward: eager (the default) or compiled (the scoring and training passes compiled)",
    )
    parser.add_argument(
        "--remove-padding",
        choices=("on", "off"),
        default="off",
        help="ppo.remove_padding: off (the default, padded rows) or on (packed passes)",
    )
    parser.add_argument(
        "--reuse-first-forward",
        choices=("on", "off"),
        default="on",
        help="ppo.reuse_first_forward: on (the default: the update's first minibatch forward scores "
        "its rows) or off (a scoring pass over every row)",
    )
    args = parser.parse_args(argv)

    w = workload_from_env() or workload_from_harness(args.workload)
    iters = args.iters or w["iters"]
    import torch

    torch.set_num_threads(int(w["threads"]))
    with tempfile.TemporaryDirectory(prefix="rlhf-lit-bench-") as out_dir:  # the export at the end of fit
        result = run(
            w,
            iters,
            args.accelerator,
            args.precision,
            out_dir,
            args.old_logprobs,
            args.decode,
            args.forward,
            args.remove_padding == "on",
            args.reuse_first_forward == "on",
        )
    out = summarize(result, w)
    from rlhf_lit.models.compiled_generation import compile_stats

    stats = compile_stats()  # all zero on the eager path
    forward_stats = result["forward_stats"]  # all zero on the eager path
    out.update(
        {
            "decode": args.decode,
            "compile_graphs": stats.graphs,
            "compile_calls_s": stats.compile_calls_s,
            "forward": args.forward,
            "forward_compile_graphs": forward_stats.graphs,
            "forward_compile_calls_s": forward_stats.compile_calls_s,
        }
    )
    out.update(
        {
            "workload": w["workload"],
            "iters": iters,
            "accelerator": args.accelerator,
            "precision": args.precision,
            "old_logprobs": args.old_logprobs,
            "remove_padding": args.remove_padding,
            "reuse_first_forward": args.reuse_first_forward,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        }
    )
    print(
        f"rlhf-lit PPOModule, workload {w['workload']}, {iters} iterations ({args.accelerator}, {args.precision}, "
        f"old logprobs: {args.old_logprobs}, decode: {args.decode}, forward: {args.forward}, "
        f"remove padding: {args.remove_padding}, reuse first forward: {args.reuse_first_forward}):"
    )
    print(
        f"  iteration {out['iter_median_s']:.3f} s [{out['iter_min_s']:.3f} .. {out['iter_max_s']:.3f}]"
        f"  (first {out['first_iter_s']:.3f} s; CPU time {out['iter_cpu_median_s']:.3f} s)"
    )
    print(
        f"  generate {out['gen_s']:.3f} s  scoring {out['rollout_s']:.3f} s  training {out['train_s']:.3f} s"
        f"  text {out['text_s']:.3f} s  other {out['other_s']:.3f} s"
    )
    print(
        f"  {out['tokens_per_s']:.0f} generated tokens/s per iteration ({out['gen_tokens_per_s']:.0f} while generating)"
        f"  peak RSS {out['peak_rss_mib']:.0f} MiB"
    )
    if args.decode == "compiled":
        print(
            f"  compiled decode: {stats.graphs} graph(s) compiled in calls of {stats.compile_calls_s:.1f} s in all"
            f" (the first iteration; {stats.compile_calls_s / iters:.3f} s per iteration over these {iters})"
        )
    if args.forward == "compiled":
        print(
            f"  compiled passes: {forward_stats.graphs} graph(s) compiled in calls of "
            f"{forward_stats.compile_calls_s:.1f} s in all ({forward_stats.calls} calls)"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

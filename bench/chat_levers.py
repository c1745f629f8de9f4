"""The chat demo's speed levers on SmolLM2-135M-Instruct, each a ratio against the plain run in the same
process on the same machine: sampling (fp32 against bf16 autocast; one thread against two; the token drawn
by ``torch.multinomial`` against one uniform per row, ``sampling.draw: inverse_cdf``) and one
training step of the reward model (the full model against ``trainable_layers``; fp32 against bf16
autocast; with ``cache_frozen``, the rows' frozen blocks kept before the first step, and the steps that
read them).

    .venv/bin/python bench/chat_levers.py [--model DIR] [--samples 64] [--steps 4] [--trainable-layers 4,8]

Sampling: ``--samples`` replies of 48 new tokens to the chat demo's requests (first HH-RLHF human turns in
the ChatML template), batch 64, temperature 1, timed after one warm-up batch. A training step: a batch
of 8 pairs (16 sequences of the same requests with sampled replies), forward, the pair loss, backward
and an AdamW step, median of ``--steps`` after one warm-up step. bf16 autocast pays on a CPU with bf16
instructions (AMX: ``amx_bf16``; AVX-512's ``avx512_bf16``, in /proc/cpuinfo); on one without, it is slower
than fp32.
Writes ``bench/results/chat-levers-<UTC date>.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from results_file import new_result_path, utc_date

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def cpu_extensions() -> str:
    """The CPU's matrix and vector extensions that decide the lever's worth (rlhf-lit's one reader of
    /proc/cpuinfo, :func:`rlhf_lit.models.precision.cpu_flags`)."""
    from rlhf_lit.models.precision import cpu_flags

    flags = cpu_flags()
    if flags is None:
        return "unknown"
    named = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
    return " ".join(f for f in named if f in flags) or f"none of {', '.join(named)}"


def autocast(precision: str):
    """bf16 autocast on the CPU, or nothing for fp32 (the reward-model step; sampling takes the library's
    ``precision``)."""
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()


def requests(tokenizer, n: int) -> list[list[int]]:
    """``n`` chat-demo requests (distinct first human turns, in file order) rendered with the generation prompt."""
    from demo.chat_plan import HH_FILE
    from demo.chat_prompts import first_human_turns

    turns = first_human_turns(HH_FILE)[:n]
    rendered = [
        tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
        for t in turns
    ]
    return [tokenizer(r, add_special_tokens=False)["input_ids"] for r in rendered]


def sampling_seconds(model, tokenizer, prompts, precision: str, threads: int, draw: str = "multinomial") -> float:
    """Seconds per reply of sampling ``prompts`` (48 new tokens, batch 64, tokens drawn by ``draw``) after one
    warm-up batch."""
    import torch

    from rlhf_lit.models.generation import SamplingConfig, sample_batches

    torch.set_num_threads(threads)
    config = SamplingConfig(temperature=1.0, max_new_tokens=48, draw=draw)
    sampled_at = "bf16-mixed" if precision == "bf16" else "32-true"  # the lever as users set it: --precision
    list(sample_batches(model, tokenizer, prompts[:8], config, batch_size=8, seed=1, precision=sampled_at))
    t0 = time.perf_counter()
    list(sample_batches(model, tokenizer, prompts, config, batch_size=64, seed=0, precision=sampled_at))
    return (time.perf_counter() - t0) / len(prompts)


def step_seconds(
    path: str, tokenizer, rows, precision: str, trainable_layers: int | None, steps: int, cached: bool = False
) -> tuple[float, float]:
    """Seconds of one reward-model step (pair loss, backward, AdamW) on ``rows`` (chosen, rejected, ...):
    the median of ``steps`` after the first, and the first. With ``cached`` the frozen trunk's output is
    kept (``cache_frozen``): "the first" is then the prefill of the rows (before any step), and every step
    reads them."""
    import torch

    from rlhf_lit.models import load_reward_model
    from rlhf_lit.models.freezing import freeze_lower_layers, transformer_blocks
    from rlhf_lit.models.scoring import sequence_scores
    from rlhf_lit.models.trunk_cache import TrunkCaches

    torch.set_num_threads(2)
    model = freeze_lower_layers(load_reward_model(path, tokenizer), trainable_layers).train()
    caches = TrunkCaches()
    if cached:
        caches.attach(model, len(transformer_blocks(model)) - trainable_layers)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    width = max(map(len, rows))
    ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    times = []
    if cached:  # the rows kept before the first step, as the stages keep them (batched, sorted by length)
        t0 = time.perf_counter()
        with autocast(precision):
            caches.prefill([(ids, mask)])
        times.append(time.perf_counter() - t0)
    for _ in range(steps + (0 if cached else 1)):
        t0 = time.perf_counter()
        with autocast(precision):
            scores = sequence_scores(model, ids, mask)  # the library's pass: the score at each row's last token
        loss = -torch.nn.functional.logsigmoid(scores[0::2].float() - scores[1::2].float()).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:]), times[0]


def main(argv: list[str] | None = None) -> int:
    """Measure every lever, print the table, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="SmolLM2-135M-Instruct folder (default: make smollm2's cache)")
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument(
        "--trainable-layers",
        type=lambda text: [int(k) for k in text.split(",")],
        default=[4],
        metavar="K,K,...",
        help="the reward-model step with the top K blocks trainable, for each K (default: 4)",
    )
    args = p.parse_args(argv)
    from demo.chat_plan import fetched_model

    path = args.model or fetched_model()
    from rlhf_lit.models import load_causal_lm
    from rlhf_lit.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(path, padding_side="left")
    prompts = requests(tokenizer, args.samples)
    policy = load_causal_lm(path, tokenizer).eval()
    sampling = {
        (precision, threads, draw): sampling_seconds(policy, tokenizer, prompts, precision, threads, draw)
        for precision, threads, draw in (
            ("fp32", 2, "multinomial"),
            ("bf16", 2, "multinomial"),
            ("fp32", 1, "multinomial"),
            ("bf16", 2, "inverse_cdf"),
        )
    }
    print("sampling, s per reply:", {" ".join(map(str, k)): round(s, 3) for k, s in sampling.items()}, flush=True)
    # Training rows: each request with two of its sampled-style replies (the request's own tokens repeated
    # stand in for a reply: the step's cost depends on the lengths, not the words).
    rows = [r + r[-48:] for r in prompts[:16]]
    ks = args.trainable_layers
    step = {
        (precision, layers): step_seconds(path, tokenizer, rows, precision, layers, args.steps)[0]
        for precision, layers in (
            ("fp32", None),
            *(("fp32", k) for k in ks),
            ("bf16", None),
            *(("bf16", k) for k in ks),
        )
    }
    cached = {k: step_seconds(path, tokenizer, rows, "bf16", k, args.steps, cached=True) for k in ks}
    plain_s, plain_t = sampling[("fp32", 2, "multinomial")], step[("fp32", None)]
    bf16_s, fp32_1, bf16_cdf = (
        sampling[k] for k in (("bf16", 2, "multinomial"), ("fp32", 1, "multinomial"), ("bf16", 2, "inverse_cdf"))
    )
    table = [
        ("sampling, fp32, 2 threads (plain)", plain_s, 1.0),
        ("sampling, bf16 autocast, 2 threads", bf16_s, plain_s / bf16_s),
        ("sampling, fp32, 1 thread", fp32_1, plain_s / fp32_1),
        ("sampling, bf16 autocast, 2 threads, draw: inverse_cdf", bf16_cdf, plain_s / bf16_cdf),
        ("RM step, fp32, full model (plain)", plain_t, 1.0),
        *((f"RM step, fp32, top {k} blocks", step[("fp32", k)], plain_t / step[("fp32", k)]) for k in ks),
        ("RM step, bf16 autocast, full model", step[("bf16", None)], plain_t / step[("bf16", None)]),
        *((f"RM step, bf16 autocast, top {k} blocks", step[("bf16", k)], plain_t / step[("bf16", k)]) for k in ks),
    ]
    for k, (read, first) in cached.items():
        table += [
            (
                f"bf16 autocast, top {k} blocks, cache_frozen: the batch's rows kept before the first step",
                first,
                plain_t / first,
            ),
            (f"RM step, bf16 autocast, top {k} blocks, cache_frozen: rows read", read, plain_t / read),
        ]
    result = {
        "date": utc_date(),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {cpu_extensions()}",
        "command": " ".join([sys.executable, *sys.argv]),
        "rows": [{"lever": name, "seconds": s, "speed-up": r} for name, s, r in table],
    }
    out = new_result_path("chat-levers", result["date"])
    out.write_text(json.dumps(result, indent=1))
    print("| lever | seconds (per reply or step) | speed-up |\n|---|---|---|")
    for name, s, r in table:
        print(f"| {name} | {s:.3f} | {r:.2f}x |")
    print(f"machine: {result['machine']}; written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

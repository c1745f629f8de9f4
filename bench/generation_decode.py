"""Seconds per rollout's generation, ``sampling.decode`` eager against compiled, on a peer-bench
workload's policy and prompts (its ``workloads.py``; the harness is not part of this repository,
``PEERBENCH_HARNESS`` names its folder) or any causal LM (``--model``, e.g. the shipped stories260K).

One rollout's generation = one :func:`~rlhf_lit.models.generation.generate_responses` call on the
workload's batch of left-padded prompts, ``resp_len`` tokens per row (``ignore_eos``, as the PPO
benchmark runs), temperature from the workload, the step logprobs recorded (``--record``, as
``ppo.old_logprobs: sampling`` does). The two paths alternate, rollout by rollout, with the same
seeds, so both see the same machine load. The compiled path's first call compiles: it is reported
apart (and amortised: the rollouts after which compiling has paid for itself), and the medians are
of the calls after it. The last line checks exactness: the same tokens on both paths, and the
largest difference of the recorded logprobs.

    OMP_NUM_THREADS=1 .venv/bin/python bench/generation_decode.py --workload tiny --rollouts 10
    OMP_NUM_THREADS=1 .venv/bin/python bench/generation_decode.py --model assets/models/stories260K --batch 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
HARNESS = Path(os.environ.get("PEERBENCH_HARNESS", ROOT.parent / "shared" / "peer-bench"))


def load(args):
    """The policy, its tokenizer and the ``(input_ids, attention_mask)`` prompt batch."""
    import torch

    from rlhf_lit.models import load_causal_lm
    from rlhf_lit.tokenizer import load_tokenizer

    if args.model:
        tokenizer = load_tokenizer(args.model, padding_side="left")
        texts = ["Once upon a time there was", "The cat", "Lily and Tom went to the park to", "A"]
        encoded = tokenizer((texts * args.batch)[: args.batch], return_tensors="pt", padding=True)
        ids, mask = encoded["input_ids"], encoded["attention_mask"]
        path, temperature = args.model, args.temperature or 0.7
    else:
        sys.path.insert(0, str(HARNESS))
        from prompts import build_prompt_ids  # noqa: PLC0415 (the harness is not a package)
        from workloads import WORKLOADS  # noqa: PLC0415

        w = WORKLOADS[args.workload]
        tokenizer = load_tokenizer(w["tokenizer"], padding_side="left", missing_pad="error")
        rows, masks = build_prompt_ids(tokenizer, w["prompt_len"])
        batch = args.batch or w["batch"]
        ids, mask = torch.tensor(rows[:batch]), torch.tensor(masks[:batch])
        path, temperature = w["policy"], args.temperature or w["temperature"]
        args.resp_len = args.resp_len or w["resp_len"]
    return load_causal_lm(path, tokenizer).eval(), tokenizer, ids, mask, temperature


def main(argv: list[str] | None = None) -> int:
    """Alternate the two paths, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=("tiny", "gpt2-small"), default="tiny", help="the harness's workload")
    parser.add_argument("--model", help="a causal LM directory instead of a workload (with its tokenizer)")
    parser.add_argument("--batch", type=int, default=None, help="rows (default: the workload's; 8 with --model)")
    parser.add_argument("--resp-len", type=int, default=None, help="tokens per row (default: the workload's; 32)")
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--rollouts", type=int, default=10, help="timed calls per path after the first")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--record",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="record the step logprobs (StepLogprobs), as old_logprobs: sampling does",
    )
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if args.model and args.batch is None:
        args.batch = 8

    import torch

    from rlhf_lit.models.compiled_generation import compile_stats
    from rlhf_lit.models.generation import SamplingConfig, generate_responses, stop_token_ids

    torch.set_num_threads(args.threads)
    policy, tokenizer, ids, mask, temperature = load(args)
    resp_len = args.resp_len or 32
    stops = stop_token_ids(policy, tokenizer)

    def rollout(decode: str, seed: int):
        sampling = SamplingConfig(max_new_tokens=resp_len, temperature=temperature, ignore_eos=True, decode=decode)
        start = time.perf_counter()
        gen = generate_responses(
            policy,
            ids,
            mask,
            sampling,
            stops,
            tokenizer.pad_token_id,
            generator=torch.Generator().manual_seed(seed),
            return_logprobs=args.record,
        )
        return time.perf_counter() - start, gen

    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    first = {decode: rollout(decode, 0)[0] for decode in ("eager", "compiled")}  # warm-up; compiled compiles
    stats = compile_stats()
    same_tokens, max_diff = True, 0.0
    for seed in range(1, args.rollouts + 1):
        (te, eager), (tc, compiled) = rollout("eager", seed), rollout("compiled", seed)
        times["eager"].append(te)
        times["compiled"].append(tc)
        same_tokens &= torch.equal(eager.response_ids, compiled.response_ids)
        if args.record:
            max_diff = max(max_diff, float((eager.logprobs - compiled.logprobs).abs().max()))
    med = {k: statistics.median(v) for k, v in times.items()}
    saved = med["eager"] - med["compiled"]
    out = {
        "model": args.model or args.workload,
        "rows": ids.shape[0],
        "prompt_len": ids.shape[1],
        "resp_len": resp_len,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "record": args.record,
        "eager_s": med["eager"],
        "compiled_s": med["compiled"],
        "ratio": med["compiled"] / med["eager"],
        "eager_range_s": [min(times["eager"]), max(times["eager"])],
        "compiled_range_s": [min(times["compiled"]), max(times["compiled"])],
        "first_eager_s": first["eager"],
        "first_compiled_s": first["compiled"],
        "compile_graphs": stats.graphs,
        "compile_calls_s": stats.compile_calls_s,
        "break_even_rollouts": stats.compile_calls_s / saved if saved > 0 else None,
        "same_tokens": same_tokens,
        "max_logprob_diff": max_diff if args.record else None,
        "recompiles_after_first": compile_stats().graphs - stats.graphs,
    }
    print(
        f"generation of {out['rows']} rows x {resp_len} tokens after {out['prompt_len']} prompt columns, "
        f"{out['model']}, {out['threads']} thread(s), {args.rollouts} rollouts per path, alternating:"
    )
    for k in ("eager", "compiled"):
        lo, hi = out[f"{k}_range_s"]
        print(f"  decode {k:8s} {med[k]:.4f} s per rollout [{lo:.4f} .. {hi:.4f}]  (first call {first[k]:.2f} s)")
    be = "never" if out["break_even_rollouts"] is None else f"{out['break_even_rollouts']:.0f} rollouts"
    print(
        f"  compiled / eager {out['ratio']:.2f}; compiling: {stats.graphs} graph(s), calls of "
        f"{stats.compile_calls_s:.1f} s, paid back after {be}; recompiles later: {out['recompiles_after_first']}"
    )
    diff = "" if not args.record else f"; largest logprob difference {max_diff:.2e}"
    print(f"  same tokens on both paths: {same_tokens}{diff}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

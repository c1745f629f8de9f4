"""Where does each chat-demo policy spend its KL? Per position, per token, and in entropy. Read from a finished run.

    .venv/bin/python bench/chat_kl_tokens.py --demo logs/demo_chat

For every evaluated policy of a finished ``make demo-chat`` folder (``eval/*.json``: PPO's checkpoints and
export, DPO), its held-out replies are read again in float32 by the policy and by the reference (the
instruction model), and each reply's KL is split:

- by position in the reply (the first token, tokens 2-5, 6-20, 21 on, the end-of-turn token): the sampled
  log-ratio ``log pi(y_t) - log pi_ref(y_t)`` (whose sum over a reply is the evaluation's KL estimate) and the
  exact KL of the two next-token distributions at the same prefix, summed over the vocabulary;
- by token: the sampled log-ratio summed over every place a token was drawn, per reply (the tokens whose
  probability the policy raised most, and lowered most);
- the entropy of the policy's and the reference's next-token distributions at the same prefixes: a policy
  that sharpens every distribution (lower entropy everywhere, the commonest words made commoner) pays KL at
  every token for no particular reply. How much, is read from the reference itself: divided by the one
  temperature that brings its mean entropy over the replies' positions down to the policy's, its exact KL
  to itself per reply (``sharpening_kl``) is what that much sharpening alone costs.

With ``--draw`` (a best-of-N draw of the same run: ``best_of_n/best_of_n.json`` or a larger one) it also asks
whether the reward model or the judge favours the replies the instruction model finds likely: within each of
the first ``--requests`` requests, the correlation of a reply's score with its mean log-likelihood per token
under the instruction model (and with its summed log-likelihood), averaged over requests. A reward model
that scored likely replies higher would teach PPO to sharpen.

The replies are tokenised again from their text (``prompt_text`` + ``response``, plus ``<|im_end|>`` when
the reply ended); the recomputed KL is printed beside the evaluation's own as a check.

Reads only; writes ``bench/results/chat-kl-tokens-<UTC date>[-N].json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

from results_file import write_result

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BINS = ("first", "2-5", "6-20", "21+", "end of turn")
"""Positions of a reply: its first token, tokens 2-5, 6-20, 21 on; and the end-of-turn token wherever it is."""


TEMPERATURES = [round(0.5 + 0.02 * i, 2) for i in range(51)]
"""The temperatures (0.5 to 1.5) the reference is sharpened or flattened by for ``sharpening_kl``."""


def position_bin(t: int, is_end: bool) -> str:
    """The :data:`BINS` entry of token ``t`` (0-based) of a reply."""
    if is_end:
        return "end of turn"
    return "first" if t == 0 else "2-5" if t < 5 else "6-20" if t < 20 else "21+"


def split_kl(policy, reference, tokenizer, samples: list[dict], top: int = 12) -> dict:
    """The KL of ``samples`` (one evaluation's replies) split by position, by token and in entropy.

    Returns:
        ``{"replies", "kl_evaluation", "kl_recomputed", "bins": {bin: {"tokens", "sampled_kl", "exact_kl",
        "entropy", "entropy_reference"}}, "raised": [[token, nats], ...], "lowered": [...], "sharpening":
        {"temperature", "kl"}}``: KLs in nats per reply, entropies in nats per token; ``sharpening`` is the
        temperature that gives the reference the policy's mean entropy over every position of the replies and
        the reference's exact KL to itself at that temperature (None when it lies outside :data:`TEMPERATURES`).
    """
    import torch

    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    sums: dict[str, Counter] = defaultdict(Counter)
    by_token: Counter = Counter()
    recomputed = 0.0
    tempered_entropy = [0.0] * len(TEMPERATURES)  # the reference at each temperature, summed over positions
    tempered_kl = [0.0] * len(TEMPERATURES)
    for s in samples:
        prompt = tokenizer(s["prompt_text"], add_special_tokens=False).input_ids
        reply = tokenizer(s["response"], add_special_tokens=False).input_ids + ([end] if s["ended"] else [])
        ids = torch.tensor([prompt + reply])
        with torch.no_grad():
            log_pi = policy(ids).logits[0, len(prompt) - 1 : -1].float().log_softmax(-1)  # (R, V)
            log_ref = reference(ids).logits[0, len(prompt) - 1 : -1].float().log_softmax(-1)  # (R, V)
        drawn = torch.tensor(reply)[:, None]
        sampled = (log_pi.gather(1, drawn) - log_ref.gather(1, drawn))[:, 0]  # (R,)
        exact = (log_pi.exp() * (log_pi - log_ref)).sum(-1)  # (R,)
        entropy = -(log_pi.exp() * log_pi).sum(-1)  # (R,)
        entropy_ref = -(log_ref.exp() * log_ref).sum(-1)  # (R,)
        recomputed += float(sampled.sum())
        for i, temperature in enumerate(TEMPERATURES):
            log_t = (log_ref / temperature).log_softmax(-1)  # (R, V)
            tempered_entropy[i] += float(-(log_t.exp() * log_t).sum())
            tempered_kl[i] += float((log_t.exp() * (log_t - log_ref)).sum())
        for t, token in enumerate(reply):
            b = position_bin(t, token == end)
            row = sums[b]
            row["tokens"] += 1
            row["sampled_kl"] += float(sampled[t])
            row["exact_kl"] += float(exact[t])
            row["entropy"] += float(entropy[t])
            row["entropy_reference"] += float(entropy_ref[t])
            by_token[tokenizer.decode([token])] += float(sampled[t])
    n = len(samples)
    bins = {}
    for b in BINS:
        row = sums.get(b)
        if not row:
            continue
        bins[b] = {
            "tokens": row["tokens"] / n,
            "sampled_kl": row["sampled_kl"] / n,
            "exact_kl": row["exact_kl"] / n,
            "entropy": row["entropy"] / row["tokens"],
            "entropy_reference": row["entropy_reference"] / row["tokens"],
        }
    tokens = sum(row["tokens"] for row in sums.values())
    policy_entropy = sum(row["entropy"] for row in sums.values()) / tokens
    sharpening = matched_temperature(
        [h / tokens for h in tempered_entropy], [k / n for k in tempered_kl], policy_entropy
    )
    ranked = sorted(by_token.items(), key=lambda kv: kv[1])
    return {
        "replies": n,
        "kl_evaluation": sum(float(s["kl"]) for s in samples) / n,
        "kl_recomputed": recomputed / n,
        "bins": bins,
        "raised": [[k, v / n] for k, v in reversed(ranked[-top:])],
        "lowered": [[k, v / n] for k, v in ranked[:top]],
        "sharpening": sharpening,
    }


def matched_temperature(entropies: list[float], kls: list[float], target: float) -> dict | None:
    """The temperature of :data:`TEMPERATURES` at which the mean entropy ``entropies`` (increasing with it)
    equals ``target``, and the KL ``kls`` there, both interpolated linearly; None outside the grid."""
    for i in range(len(TEMPERATURES) - 1):
        lo, hi = entropies[i], entropies[i + 1]
        if lo <= target <= hi and hi > lo:
            f = (target - lo) / (hi - lo)
            return {
                "temperature": TEMPERATURES[i] + f * (TEMPERATURES[i + 1] - TEMPERATURES[i]),
                "kl": kls[i] + f * (kls[i + 1] - kls[i]),
            }
    return None


def pearson(x: list[float], y: list[float]) -> float:
    """The demo's Pearson correlation (:func:`demo.diversity_measures.pearson`), 0 when either side is constant
    (a request whose replies all score alike says nothing either way)."""
    from demo.diversity_measures import pearson as demo_pearson

    r = demo_pearson(x, y)
    return 0.0 if r is None else r


def likelihood_correlations(reference, tokenizer, draw: dict, requests: int) -> dict:
    """Within-request correlations of the reward model's score and the judge with each reply's log-likelihood
    under ``reference`` (its mean per token, and its sum), over the first ``requests`` requests of ``draw``.

    Returns:
        ``{"requests", "replies_per_request", name: {"mean", "stderr"}}`` for ``rm~mean_logp``, ``judge~mean_logp``,
        ``rm~sum_logp``, ``judge~sum_logp`` and ``rm~judge``: the mean over requests and its standard error.
    """
    import torch

    from demo.seed_stats import mean_se
    from rlhf_lit.functional import token_logprobs

    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    by_request: dict[int, list[dict]] = {}
    for s in draw["samples"]:
        if int(s["prompt_index"]) < requests:
            by_request.setdefault(int(s["prompt_index"]), []).append(s)
    pairs = {"rm~mean_logp": [], "judge~mean_logp": [], "rm~sum_logp": [], "judge~sum_logp": [], "rm~judge": []}
    for index, replies in sorted(by_request.items()):
        prompt = tokenizer(draw["prompt_texts"][index], add_special_tokens=False).input_ids
        means, sums = [], []
        for s in replies:
            reply = tokenizer(s["response"], add_special_tokens=False).input_ids + ([end] if s["ended"] else [])
            with torch.no_grad():
                logits = reference(torch.tensor([prompt + reply])).logits[:, len(prompt) - 1 : -1]  # (1, R, V)
            logp = token_logprobs(logits, torch.tensor([reply]))[0]  # (R,)
            means.append(float(logp.mean()))
            sums.append(float(logp.sum()))
        rm, judge = [float(s["rm"]) for s in replies], [float(s["judge"]) for s in replies]
        pairs["rm~mean_logp"].append(pearson(rm, means))
        pairs["judge~mean_logp"].append(pearson(judge, means))
        pairs["rm~sum_logp"].append(pearson(rm, sums))
        pairs["judge~sum_logp"].append(pearson(judge, sums))
        pairs["rm~judge"].append(pearson(rm, judge))
    out: dict = {"requests": len(by_request), "replies_per_request": min(len(r) for r in by_request.values())}
    for name, values in pairs.items():
        mean, se = mean_se(values)
        out[name] = {"mean": mean, "stderr": se}
    return out


def main(argv: list[str] | None = None) -> int:
    """Split the KL of every evaluated policy of ``--demo``; print and write the result."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--demo", required=True, help="a finished `make demo-chat` folder (read only)")
    p.add_argument("--top", type=int, default=12, help="tokens listed as raised and as lowered")
    p.add_argument("--draw", default=None, help="a best-of-N draw of the run (best_of_n.json): likelihood correlations")
    p.add_argument("--requests", type=int, default=24, help="requests of --draw read (each reply is read again)")
    args = p.parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    from demo.chat_report import read_evaluations

    policies = {
        name: evaluation
        for name, evaluation in read_evaluations(args.demo).items()
        if evaluation["config"]["policy"] != evaluation["config"]["reference"]  # not the instruction model itself
    }
    if not policies:
        p.error(f"{args.demo}/eval holds no evaluated policy other than the reference")
    reference_path = next(iter(policies.values()))["config"]["reference"]
    tokenizer = AutoTokenizer.from_pretrained(reference_path)
    reference = AutoModelForCausalLM.from_pretrained(reference_path, dtype=torch.float32).eval()
    out = {}
    for name, evaluation in policies.items():
        policy = AutoModelForCausalLM.from_pretrained(evaluation["config"]["policy"], dtype=torch.float32).eval()
        out[name] = split_kl(policy, reference, tokenizer, evaluation["samples"], args.top)
        r = out[name]
        print(f"== {name}: KL {r['kl_recomputed']:.3f} nats a reply (the evaluation's: {r['kl_evaluation']:.3f})")
        for b, row in r["bins"].items():
            print(
                f"  {b:12s} {row['tokens']:5.2f} tokens  sampled {row['sampled_kl']:+.3f}  exact {row['exact_kl']:.3f}"
                f"  entropy {row['entropy']:.3f} (reference {row['entropy_reference']:.3f})"
            )
        if r["sharpening"]:
            t, kl = r["sharpening"]["temperature"], r["sharpening"]["kl"]
            print(f"  the reference sharpened to its entropy: temperature {t:.3f}, KL {kl:.3f} nats a reply")
        print("  raised:", ", ".join(f"{k!r} {v:+.3f}" for k, v in r["raised"]))
        print("  lowered:", ", ".join(f"{k!r} {v:+.3f}" for k, v in r["lowered"]))
    fields = {"demo": str(Path(args.demo).resolve()), "policies": out}
    if args.draw:
        correlations = likelihood_correlations(
            reference, tokenizer, json.loads(Path(args.draw).read_text()), args.requests
        )
        print(f"within-request correlations over {correlations['requests']} requests of --draw:")
        for name, value in correlations.items():
            if isinstance(value, dict):
                print(f"  {name:16s} {value['mean']:+.3f} +- {value['stderr']:.3f}")
        fields |= {"draw": str(Path(args.draw).resolve()), "likelihood_correlations": correlations}
    write_result("chat-kl-tokens", fields)
    return 0


if __name__ == "__main__":
    sys.exit(main())

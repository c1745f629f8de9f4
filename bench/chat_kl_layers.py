"""Which of a chat-demo policy's trained parameters carry its KL, and which its judge score? Read from a finished run.

    .venv/bin/python bench/chat_kl_layers.py --demo logs/demo_chat

For every evaluated policy of a finished ``make demo-chat`` folder (``eval/*.json``: PPO's checkpoints and
export, DPO), the tensors it changed are set back to the instruction model's values one group at a time, and
each such hybrid is evaluated as the demo evaluates a policy (:func:`demo.chat_report.evaluate_as_the_demo`:
one reply to each held-out request at sampling seed 0, the judge, the KL to the instruction model). A group
whose reverting takes away most of the policy's KL and little of its judge gain holds KL that bought no score.

The groups (:func:`parameter_groups`), found from the model's own modules, not from an architecture's names:
each transformer block, the attention and the MLP parts of every block together, the blocks' own norms (and
anything else in them), and what lies outside the blocks (a final norm; embeddings, which ``trainable_layers`` keeps frozen). "nothing"
reverts no tensor: the policy itself, evaluated again as a check against the run's own evaluation.

Every hybrid samples with the same seed as the instruction model's evaluation (the demo's draws use one
uniform per token), so a hybrid's judge gain is read request by request against the instruction model's
reply to the same request: mean +- standard error over the requests.

Reads the folder only (hybrids are written to a temporary folder and removed); writes
``bench/results/chat-kl-layers-<UTC date>[-N].json``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from results_file import write_result

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the demo's package, beside rlhf_lit in a clone


ATTENTION = ("attn", "attention")
"""A block's child module whose name holds one of these is its attention (``self_attn``, ``attention``)."""

MLP = ("mlp", "feed_forward", "ffn")
"""A block's child module whose name holds one of these is its MLP (``mlp``, ``feed_forward``)."""


def parameter_groups(model) -> dict[str, list[str]]:
    """``{group: parameter names}`` of ``model``: ``block <i>`` for each transformer block (``i`` its index in
    the stack), ``attention`` and ``mlp`` (those parts of every block), ``block norms`` (the rest of the
    blocks' parameters) and ``outside the blocks``. Every parameter is in exactly one of the last four."""
    from rlhf_lit.models.freezing import transformer_blocks

    blocks = transformer_blocks(model)
    prefix = {id(m): name for name, m in model.named_modules()}[id(blocks)]
    groups: dict[str, list[str]] = {f"block {i}": [] for i in range(len(blocks))}
    groups |= {"attention": [], "mlp": [], "block norms": [], "outside the blocks": []}
    for name, _ in model.named_parameters():
        if not name.startswith(prefix + "."):
            groups["outside the blocks"].append(name)
            continue
        index, _, inside = name[len(prefix) + 1 :].partition(".")
        groups[f"block {index}"].append(name)
        child = inside.split(".")[0]
        groups[block_part(child, type(blocks[int(index)].get_submodule(child)).__name__)].append(name)
    return groups


def block_part(child: str, kind: str) -> str:
    """The group of a block's child module named ``child`` of class ``kind``: ``block norms`` for a norm
    (its class names one: ``LlamaRMSNorm``, ``LayerNorm``; ``post_attention_layernorm`` is a norm, not
    attention), else ``attention`` or ``mlp`` by its name; anything else counts with the norms."""
    if "norm" in kind.lower():
        return "block norms"
    name = child.lower()
    return "attention" if any(a in name for a in ATTENTION) else "mlp" if any(m in name for m in MLP) else "block norms"


def changed_tensors(policy_state: Mapping, reference_state: Mapping) -> dict[str, float]:
    """``{name: |policy - reference| / |reference|}`` of every tensor of ``policy_state`` that differs from
    ``reference_state``'s (both state dicts of one architecture)."""
    changed = {}
    for name, value in policy_state.items():
        ref = reference_state[name]
        if value.shape != ref.shape:
            raise ValueError(
                f"{name}: the policy's shape {tuple(value.shape)} is not the reference's {tuple(ref.shape)}"
            )
        if not bool((value.float() == ref.float()).all()):
            changed[name] = float((value.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-12))
    return changed


def reverted_state(policy_state: Mapping, reference_state: Mapping, names: Sequence[str]) -> dict:
    """``policy_state`` with the tensors ``names`` set back to ``reference_state``'s (new tensors; neither
    input is changed)."""
    keep = set(names)
    return {k: (reference_state[k] if k in keep else v).clone() for k, v in policy_state.items()}


def paired_gain(samples: Sequence[Mapping], base_samples: Sequence[Mapping]) -> dict:
    """The judge gain over the instruction model request by request: ``{mean, stderr}`` of each request's
    judge minus the instruction model's on the same request (matched by ``prompt_index``;
    :func:`chat_kl_optimum.paired_gain`)."""
    from chat_kl_optimum import paired_gain as gain

    base = {s["prompt_index"]: s["judge"] for s in base_samples}
    missing = [s["prompt_index"] for s in samples if s["prompt_index"] not in base]
    if missing:
        raise ValueError(f"requests {missing[:5]} have no reply of the instruction model to pair with")
    ordered = sorted(samples, key=lambda s: s["prompt_index"])
    mean, se = gain([s["judge"] for s in ordered], [base[s["prompt_index"]] for s in ordered])
    return {"mean": mean, "stderr": None if math.isnan(se) else se}  # NaN: one request, no error


def measure_hybrids(
    policy_path: str, reference_path: str, groups: Sequence[str] | None, evaluate, base_samples: Sequence[Mapping]
) -> dict:
    """Every group's hybrid of one policy, evaluated by ``evaluate(model folder) -> evaluation``; a group is
    measured when the policy changed a tensor of it (and, given ``groups``, it is named there)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reference_state = AutoModelForCausalLM.from_pretrained(reference_path, dtype=torch.float32).state_dict()
    policy = AutoModelForCausalLM.from_pretrained(policy_path, dtype=torch.float32)
    policy_state = {k: v.clone() for k, v in policy.state_dict().items()}
    changed = changed_tensors(policy_state, reference_state)
    all_groups = {"nothing": []} | parameter_groups(policy)
    out = {"changed_tensors": len(changed), "groups": {}}
    tokenizer = AutoTokenizer.from_pretrained(policy_path)
    with tempfile.TemporaryDirectory(prefix="chat-kl-layers-") as scratch:
        for group, names in all_groups.items():
            touched = [n for n in names if n in changed]
            if (group != "nothing" and not touched) or (groups is not None and group not in groups):
                continue
            policy.load_state_dict(reverted_state(policy_state, reference_state, touched))
            folder = Path(scratch) / "hybrid"
            policy.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            evaluation = evaluate(str(folder))
            metrics = evaluation["metrics"]
            out["groups"][group] = {
                "reverted_tensors": len(touched),
                "relative_change": max((changed[n] for n in touched), default=0.0),
                "kl": metrics["kl_mean"],
                "judge": metrics["judge_mean"],
                "judge_gain": paired_gain(evaluation["samples"], base_samples),
                "ended": metrics["ended_fraction"],
                "distinct_2": metrics["distinct_2"],
            }
            row, gain = out["groups"][group], out["groups"][group]["judge_gain"]
            se = "" if gain["stderr"] is None else f" +- {gain['stderr']:.3f}"
            print(
                f"  {group:20s} reverted {len(touched):3d}  KL {row['kl']:.3f}  judge {row['judge']:.3f}"
                f"  gain {gain['mean']:+.3f}{se}",
                flush=True,
            )
    return out


def main(argv: list[str] | None = None) -> int:
    """Measure every evaluated policy's hybrids; print and write the result."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--demo", required=True, help="a finished `make demo-chat` folder (read only)")
    p.add_argument(
        "--policies", default=None, help="comma-separated evaluation names (eval/<name>.json); all by default"
    )
    p.add_argument(
        "--groups", default=None, help="comma-separated groups (e.g. 'nothing,mlp,block 29'); all by default"
    )
    p.add_argument("--judge", default="rlhf_lit.evaluation.judges:vader", help="the demo's judge")
    args = p.parse_args(argv)
    import torch

    from demo.chat_report import evaluate_as_the_demo, read_evaluations
    from rlhf_lit.data.prompt_source import read_prompt_source
    from rlhf_lit.evaluation.judges import load_judge

    demo = Path(args.demo)
    torch.set_num_threads(2)
    evaluations = read_evaluations(demo)
    if "instruction" not in evaluations:
        p.error(f"--demo {demo}: no eval/instruction.json (not a finished `make demo-chat` folder)")
    base = evaluations.pop("instruction")
    wanted = None if args.policies is None else set(args.policies.split(","))
    evaluations = {name: e for name, e in evaluations.items() if wanted is None or name in wanted}
    if wanted is not None and wanted - set(evaluations):
        p.error(f"--policies: no eval/<name>.json for {sorted(wanted - set(evaluations))}")
    precision = json.loads((demo / "results.json").read_text(encoding="utf-8"))["precision"]
    prompts = read_prompt_source(str(demo / "data" / "eval.jsonl")).prompts
    judge = load_judge(args.judge)
    reference = base["config"]["policy"]

    def evaluate(folder: str) -> dict:
        return evaluate_as_the_demo(folder, prompts, reference, judge, precision)

    groups = None if args.groups is None else args.groups.split(",")
    out = {}
    for name, evaluation in evaluations.items():
        m = evaluation["metrics"]
        print(f"== {name}: the run's evaluation KL {m['kl_mean']:.3f}, judge {m['judge_mean']:.3f}", flush=True)
        out[name] = {"evaluation": {"kl": m["kl_mean"], "judge": m["judge_mean"]}}
        out[name] |= measure_hybrids(evaluation["config"]["policy"], reference, groups, evaluate, base["samples"])
    fields = {
        "demo": str(demo.resolve()),
        "instruction_model": {"judge": base["metrics"]["judge_mean"]},
        "policies": out,
    }
    write_result("chat-kl-layers", fields)
    return 0


if __name__ == "__main__":
    sys.exit(main())

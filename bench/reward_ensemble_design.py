"""Which reward-model ensemble design: M separate members or M heads on one shared trunk?

Trains each design on the demo's preference data with the demo RM recipe (configs/demo/reward_model.yaml:
AdamW lr 1e-3, 10 warmup steps, linear decay to 0, 2 epochs of 16 pairs, gradient norm clipped to 1,
the same 10% held-out pairs), M members each, and measures on the held-out pairs:

- each member's pair accuracy and the accuracy of the mean of the members' normalised scores;
- the members' disagreement: the population std over members of each response's normalised score
  (what PPO's ``uncertainty_weighted`` reads), averaged over a pair's two responses, on the pairs the
  mean gets right and on those it gets wrong, and the AUROC of that std as a detector of a wrong pair;
- the mean Pearson correlation between members' scores (1 = the members are copies);
- train time and trainable parameters.

Designs:
- ``separate``: M full copies of the start model, each with its own head init (seed) and, with
  ``bootstrap``, its own Poisson(1) weight per pair and step (online bagging, Oza & Russell 2001);
- ``shared_trunk``: one trunk with an M-dim score head (row m = member m), each row initialised
  N(0, 1/sqrt(d + 1)) from its own seed, the loss the sum of the members' (weighted) pair losses.

Separate members are trained as the stage trains them: the loss is the sum of the members' losses
and each member's gradient norm is clipped on its own, so member m is the single RM its seed gives.

Every member sees the same batches in the same order (as in one training run). Normalisation is
per member (gain and bias so the held-out responses score mean 0, std 1: ``normalize: gain_bias``).

Command (from the project root; one torch thread; ~6 min on a shared CPU core):

    OMP_NUM_THREADS=1 .venv/bin/python bench/reward_ensemble_design.py --demo logs/demo --members 4

prints a markdown table and writes it with the per-member figures to ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F
from transformers import AutoModelForSequenceClassification

from rlhf_lit.data import PreferenceDataModule
from rlhf_lit.functional import concat_pairs
from rlhf_lit.models.loading import _load, init_reward_head
from rlhf_lit.models.scoring import last_true_index, score_head, token_scores
from rlhf_lit.stages.optim import OptimizerConfig, build_optimizer
from rlhf_lit.tokenizer import load_tokenizer

RECIPE = OptimizerConfig(lr=1e-3, warmup_steps=10, schedule="linear", min_lr_ratio=0.0)


def load_scorer(path: str, tokenizer, labels: int, seeds: list[int]):
    """A sequence-classification model with ``labels`` head rows, row m initialised from seeds[m]."""
    model = _load(
        AutoModelForSequenceClassification, path, tokenizer, "float32", False, None, False, True, num_labels=labels
    )
    head = score_head(model)
    for row, seed in enumerate(seeds):
        torch.manual_seed(seed)
        part = torch.nn.Linear(head.in_features, 1, bias=False)
        init_reward_head(part)
        with torch.no_grad():
            head.weight[row] = part.weight[0]
    return model


def scores(model, ids, mask) -> torch.Tensor:
    """(N, labels) head outputs at the last real token."""
    per_token = token_scores(model, ids, mask)  # (N, T) or (N, T, M)
    if per_token.dim() == 2:
        per_token = per_token.unsqueeze(-1)
    last = last_true_index(mask.bool())  # (N,)
    return per_token[torch.arange(ids.shape[0]), last]  # (N, M)


def pair_loss(diff: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """Mean over pairs of weight * -log sigmoid(diff)."""
    loss = -F.logsigmoid(diff)  # (B,)
    return loss.mean() if weight is None else (weight * loss).mean()


def train(models: list, head_of: list[tuple[int, int]], loader, epochs: int, bootstrap: bool, seed: int, pad: int):
    """Train every model on the same batches; head_of[m] = (model index, head row) of member m."""
    params = [(f"{i}.{n}", p) for i, model in enumerate(models) for n, p in model.named_parameters()]
    total = len(loader) * epochs
    opt, sched = build_optimizer(params, RECIPE, total)
    gen = torch.Generator().manual_seed(seed)
    for model in models:
        model.train()
    for _ in range(epochs):
        for batch in loader:
            ids, mask = concat_pairs(
                batch["chosen_input_ids"],
                batch["chosen_attention_mask"],
                batch["rejected_input_ids"],
                batch["rejected_attention_mask"],
                pad,
            )
            B = batch["chosen_input_ids"].shape[0]
            outs = [scores(model, ids, mask) for model in models]  # each (2B, labels)
            losses = []
            for model_index, row in head_of:
                s = outs[model_index][:, row]  # (2B,)
                weight = torch.poisson(torch.ones(B), generator=gen) if bootstrap else None
                losses.append(pair_loss(s[:B] - s[B:], weight))
            # The sum: each separate member gets exactly its own loss's gradient (as the stage trains
            # them); shared heads share the trunk's gradient.
            loss = torch.stack(losses).sum()
            opt.zero_grad()
            loss.backward()
            for model in models:  # the stage clips each separate member alone, a shared trunk as one model
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
    for model in models:
        model.eval()


@torch.no_grad()
def evaluate(models, head_of, loader, pad) -> dict:
    chosen, rejected = [], []
    for batch in loader:
        ids, mask = concat_pairs(
            batch["chosen_input_ids"],
            batch["chosen_attention_mask"],
            batch["rejected_input_ids"],
            batch["rejected_attention_mask"],
            pad,
        )
        B = batch["chosen_input_ids"].shape[0]
        outs = [scores(model, ids, mask) for model in models]
        s = torch.stack([outs[i][:, row] for i, row in head_of], dim=1).double()  # (2B, M)
        chosen.append(s[:B])
        rejected.append(s[B:])
    c, r = torch.cat(chosen), torch.cat(rejected)  # (P, M)
    pooled = torch.cat([c, r])  # (2P, M)
    mean, std = pooled.mean(0), pooled.std(0, unbiased=False)  # per member: gain_bias normalisation
    c, r = (c - mean) / std, (r - mean) / std
    member_acc = (c > r).double().mean(0)  # (M,)
    right = c.mean(1) > r.mean(1)  # (P,)
    disagreement = (c.std(1, unbiased=False) + r.std(1, unbiased=False)) / 2  # (P,)
    wrong = ~right
    # AUROC of the disagreement as a detector of a wrong pair (Mann-Whitney, ties half).
    dw, dr = disagreement[wrong], disagreement[right]
    auroc = ((dw[:, None] > dr[None]).double() + 0.5 * (dw[:, None] == dr[None]).double()).mean().item()
    M = c.shape[1]
    off = 1.0
    if M > 1:
        corr = torch.corrcoef(torch.cat([c, r]).T)  # (M, M)
        off = corr[~torch.eye(M, dtype=torch.bool)].mean().item()
    return {
        "pairs": c.shape[0],
        "member_accuracy": member_acc.tolist(),
        "mean_accuracy": right.double().mean().item(),
        "std_right": dr.mean().item(),
        "std_wrong": dw.mean().item() if len(dw) else math.nan,
        "auroc_std_wrong": auroc,
        "member_correlation": off,
    }


def run(design: str, bootstrap: bool, M: int, sft: str, tokenizer, dm, pad, seed_base: int = 1000) -> dict:
    seeds = [seed_base + m for m in range(M)]
    start = time.perf_counter()
    if design == "separate":
        models = [load_scorer(sft, tokenizer, 1, [s]) for s in seeds]
        head_of = [(m, 0) for m in range(M)]
    else:
        models = [load_scorer(sft, tokenizer, M, seeds)]
        head_of = [(0, m) for m in range(M)]
    torch.manual_seed(0)
    train(models, head_of, dm.train_dataloader(), 2, bootstrap, 7, pad)
    seconds = time.perf_counter() - start
    result = evaluate(models, head_of, dm.val_dataloader(), pad)
    result.update(
        design=design,
        bootstrap=bootstrap,
        members=M,
        seed_base=seed_base,
        train_s=round(seconds, 1),
        parameters=sum(p.numel() for model in models for p in model.parameters()),
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--demo", default="logs/demo", help="a finished demo (its sft/model and prefs/)")
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--out", default="bench/results/reward_ensemble_design.json")
    parser.add_argument("--seed-base", type=int, default=1000, help="member m's seed is seed-base + m")
    parser.add_argument(
        "--variants",
        default="all",
        choices=["all", "uniform"],
        help="all: the single RM and both designs with and without bootstrap; uniform: both designs without",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    sft = f"{args.demo}/sft/model"
    tokenizer = load_tokenizer(sft, padding_side="right")
    dm = PreferenceDataModule(
        tokenizer=tokenizer,
        train_path=f"{args.demo}/prefs/preferences.jsonl",
        val_fraction=0.1,
        seed=0,
        max_length=96,
        max_prompt_length=32,
        batch_size=16,
    )
    dm.setup("fit")
    pad = tokenizer.pad_token_id
    rows = []
    variants = [("separate", False), ("shared_trunk", False)]
    if args.variants == "all":
        variants = [("separate", False), ("separate", True), ("shared_trunk", False), ("shared_trunk", True)]
        rows.append(run("separate", False, 1, sft, tokenizer, dm, pad, args.seed_base))  # the single RM, for scale
        print(json.dumps(rows[-1]), flush=True)
    for design, bootstrap in variants:
        rows.append(run(design, bootstrap, args.members, sft, tokenizer, dm, pad, args.seed_base))
        print(json.dumps(rows[-1]), flush=True)
    print(
        "| design | bootstrap | M | seeds | member acc (each) | mean acc | std right | std wrong | AUROC(std->wrong) "
        "| member corr | train s | parameters |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        each = " / ".join(f"{a:.3f}" for a in r["member_accuracy"])
        print(
            f"| {r['design']} | {r['bootstrap']} | {r['members']} | {r['seed_base']}+m | {each} | {r['mean_accuracy']:.3f} "
            f"| {r['std_right']:.3f} | {r['std_wrong']:.3f} | {r['auroc_std_wrong']:.2f} "
            f"| {r['member_correlation']:.3f} | {r['train_s']} | {r['parameters']:,} |"
        )
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

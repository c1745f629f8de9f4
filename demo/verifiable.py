"""The offline verifiable-reward task: ``python -m demo.verifiable --out logs/verifiable``.

The rule (a reward the base model does not already satisfy): the story continuation must mention
the character named in the prompt, as a whole word, at least ``--min-count`` times
(:func:`rlhf_lit.rewards.rules:mentions_ground_truth`). Prompts are TinyStories paragraphs whose
opening words contain "named <Name>", cut after the sentence that names the character; the name is
the ``ground_truth`` column of a JSONL prompt file (``prompt`` + ``ground_truth``).

Steps, on 2 CPU cores, with the pretrained stories260K model as SFT model, reference and (for
``gae``) the value model's start (a fresh value head):

1. build   ``<out>/data/{train,heldout}.jsonl`` (disjoint paragraphs; ``--heldout`` held-out prompts);
2. fit     ``rlhf-lit fit --config configs/offline/verifiable.yaml`` once per estimator
           (``gae``, ``grpo``, ``rloo``), in parallel, one thread each -> ``<out>/<estimator>/``;
3. eval    the base model and each trained policy on the held-out prompts: rule-satisfaction rate,
           sampled (temperature 1, one sample per prompt, fixed seed) and greedy;
4. report  ``<out>/report.md`` with the table and ``<out>/curves.png`` (rule reward and KL per rollout).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from demo.plan import ASSETS, ROOT
from demo.runner import StageFailed, Timings, fit_command, start_stages, wait_stages
from demo.story_prompts import read_paragraphs

ESTIMATORS = ("gae", "grpo", "rloo")

_NAMED = re.compile(r"\bnamed ([A-Z][a-z]+)\b")
_SENTENCE_END = re.compile(r"[.!?]")


def named_prompt(paragraph: str, max_words: int = 30) -> dict[str, str] | None:
    """``{"prompt", "ground_truth"}`` from a paragraph that names a character early, else None.

    The character is the capitalised word after the first "named" within the first ``max_words``
    words; the prompt is the paragraph up to the end of that sentence (the first ``.``, ``!`` or
    ``?`` after the name, included), or up to the name when no sentence end follows it.
    """
    head = " ".join(paragraph.split()[:max_words])
    match = _NAMED.search(head)
    if match is None:
        return None
    end = _SENTENCE_END.search(head, match.end())
    prompt = head[: end.end() if end else match.end()]
    return {"prompt": prompt, "ground_truth": match.group(1)}


def build_prompts(paragraphs: Sequence[str], max_words: int = 30) -> list[dict[str, str]]:
    """:func:`named_prompt` of every paragraph that has one, in order."""
    return [r for r in (named_prompt(p, max_words) for p in paragraphs) if r is not None]


def write_prompt_files(paragraphs_path: str, out_dir: Path, heldout: int) -> tuple[Path, Path, int, int]:
    """Write ``train.jsonl`` (all but the last ``heldout`` prompts) and ``heldout.jsonl``."""
    records = build_prompts(read_paragraphs(paragraphs_path))
    if len(records) <= heldout:
        raise ValueError(f"only {len(records)} named prompts in {paragraphs_path}, need more than {heldout}")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = out_dir / "train.jsonl", out_dir / "heldout.jsonl"
    for path, rows in zip(paths, (records[:-heldout], records[-heldout:])):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return paths[0], paths[1], len(records) - heldout, heldout


def satisfaction(
    model_dir: str,
    records: list[dict],
    *,
    greedy: bool,
    max_new_tokens: int,
    min_count: int,
    seed: int = 0,
    batch_size: int = 64,
) -> dict:
    """Rule-satisfaction rate of ``model_dir`` on ``records`` (one response per prompt)."""
    import torch

    from rlhf_lit.evaluation import response_texts
    from rlhf_lit.models import load_causal_lm
    from rlhf_lit.models.generation import SamplingConfig, sample_batches
    from rlhf_lit.rewards import RewardBatch
    from rlhf_lit.rewards.rules import mentions_ground_truth
    from rlhf_lit.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(model_dir, padding_side="left")
    model = load_causal_lm(model_dir).eval()
    sampling = SamplingConfig(max_new_tokens=max_new_tokens, do_sample=not greedy)
    with torch.no_grad():
        batches = sample_batches(
            model, tokenizer, [r["prompt"] for r in records], sampling, batch_size=batch_size, seed=seed
        )
    responses = []
    for g in batches:
        responses += response_texts(tokenizer, g.query_responses, g.attention_mask, g.response_mask, g.ended)
    n = len(responses)
    batch = RewardBatch(
        prompts=[r["prompt"] for r in records],
        responses=responses,
        response_ids=[[]] * n,
        ended=[False] * n,
        extras={"ground_truth": [r["ground_truth"] for r in records]},
    )
    scores = mentions_ground_truth(batch, min_count=min_count)
    return {
        "rate": sum(scores) / n,
        "n": n,
        "samples": [
            {"prompt": r["prompt"], "response": t, "ok": s} for r, t, s in zip(records[:4], responses[:4], scores[:4])
        ],
    }


def _fit_command(config: Path, estimator: str, out: Path, train: Path, args: argparse.Namespace) -> list[str]:
    spp = "1" if estimator == "gae" else str(args.samples_per_prompt)
    cmd = fit_command(
        config,
        [
            "--model.init_args.sft_model",
            args.base_model,
            "--model.init_args.ppo.estimator",
            estimator,
            "--model.init_args.sampling.samples_per_prompt",
            spp,
            "--model.init_args.sampling.max_new_tokens",
            str(args.max_new_tokens),
            "--model.init_args.max_rollouts",
            str(args.rollouts),
            "--model.init_args.export_dir",
            str(out / estimator / "model"),
            "--model.init_args.reward.sources",
            json.dumps(
                [
                    {
                        "name": "mentions",
                        "function": "rlhf_lit.rewards.rules:mentions_ground_truth",
                        "kwargs": {"min_count": args.min_count},
                    }
                ]
            ),
            "--trainer.logger.init_args.save_dir",
            str(out),
            "--trainer.logger.init_args.name",
            estimator,
            "--trainer.logger.init_args.version",
            "0",
            "--data.init_args.train_path",
            str(train),
        ],
    )
    if estimator == "gae":
        cmd += ["--model.init_args.value_model", args.base_model]
        # k = 1: the same number of sampled responses per rollout as the group estimators
        cmd += ["--data.init_args.batch_size", str(args.prompts_per_rollout * args.samples_per_prompt)]
    else:
        cmd += ["--data.init_args.batch_size", str(args.prompts_per_rollout)]
    return cmd


def _scalars(run: Path) -> dict[str, tuple[list[int], list[float]]]:
    from demo.report import read_scalars

    return read_scalars(str(run))


def _pick(tags: dict, *candidates: str) -> str | None:
    return next((t for t in candidates if t in tags), None)


def write_report(out: Path, results: dict, timings: dict, commands: dict, args: argparse.Namespace) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_k) = plt.subplots(1, 2, figsize=(10, 4))
    curves = {}
    for est in ESTIMATORS:
        tags = _scalars(out / est / "version_0")
        r_tag = _pick(tags, "reward/mentions", "train/reward/mentions")
        k_tag = _pick(tags, "objective/kl", "train/objective/kl", "ppo/kl", "kl/mean")
        curves[est] = (r_tag, k_tag, sorted(tags))
        if r_tag:
            ax_r.plot(*tags[r_tag], label=est)
        if k_tag:
            ax_k.plot(*tags[k_tag], label=est)
    ax_r.set(title="rule reward (mean per rollout)", xlabel="rollout")
    ax_k.set(title="KL to reference (per response)", xlabel="rollout")
    ax_r.legend(), ax_k.legend()
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=100)
    plt.close(fig)

    lines = [
        "# Verifiable-reward task",
        "",
        f"Rule: the response names the prompt's character at least {args.min_count} time(s) "
        f"(`rlhf_lit.rewards.rules:mentions_ground_truth`); {results['base']['sampled']['n']} held-out "
        f"prompts; {args.max_new_tokens} new tokens; {args.rollouts} rollouts of "
        f"{args.prompts_per_rollout * args.samples_per_prompt} responses each.",
        "",
        "| model | rule rate sampled (T=1, seed 0) | rule rate greedy | final KL (nats / response) | run wall (s) | s / rollout |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        kl = r.get("final_kl")
        t, rs = timings.get(name), r.get("rollout_s")
        lines.append(
            f"| {name} | {r['sampled']['rate']:.3f} | {r['greedy']['rate']:.3f} | "
            f"{'-' if kl is None else f'{kl:.2f}'} | {'-' if t is None else f'{t:.0f}'} | "
            f"{'-' if rs is None else f'{rs:.2f}'} |"
        )
    lines += [
        "",
        "s / rollout = mean of time/generate_s + time/score_s + time/train_s (generation, scoring, the "
        "PPO update) per rollout; run wall = the whole fit command, model loading included. The three "
        "runs go in parallel on the machine's cores, one thread each. final KL = objective/kl of the "
        "last rollout (sum over response tokens of log pi - log pi_ref on the rollout's samples).",
        "",
        "![curves](curves.png)",
        "",
        "Tags plotted: " + ", ".join(f"{e}: {c[0]}, {c[1]}" for e, c in curves.items()),
        "",
        "## Commands",
        "",
    ]
    lines += [f"- {e}: `{' '.join(c)}`" for e, c in commands.items()]
    lines += ["", "## Samples (sampled, held-out)", ""]
    for name, r in results.items():
        for s in r["sampled"]["samples"][:2]:
            lines.append(f"- {name}: {s['prompt']!r} -> {s['response']!r} ({s['ok']})")
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m demo.verifiable", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", default="logs/verifiable")
    p.add_argument("--config", default=str(ROOT / "configs" / "offline" / "verifiable.yaml"))
    p.add_argument("--base-model", default=str(ASSETS / "models" / "stories260K"))
    p.add_argument("--paragraphs", default=str(ASSETS / "data" / "tinystories" / "val.txt"))
    p.add_argument("--heldout", type=int, default=128, help="held-out prompts (the last ones)")
    p.add_argument("--min-count", type=int, default=1, help="mentions the rule asks for")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--rollouts", type=int, default=25)
    p.add_argument("--prompts-per-rollout", type=int, default=8)
    p.add_argument("--samples-per-prompt", type=int, default=4, help="k of grpo / rloo")
    p.add_argument("--estimators", nargs="+", default=list(ESTIMATORS), choices=ESTIMATORS)
    p.add_argument("--base-only", action="store_true", help="only build prompts and measure the base rate")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        # Prompt files, logs, exports and the report would overwrite what is there: never a user's files.
        print(
            f"[verifiable] --out {out} exists and is not empty; choose a new directory (an earlier run's "
            "outputs are left as they are)",
            file=sys.stderr,
        )
        return 2
    train, heldout_path, n_train, n_held = write_prompt_files(args.paragraphs, out / "data", args.heldout)
    print(f"[verifiable] {n_train} train prompts, {n_held} held-out -> {out / 'data'}", flush=True)
    held = [json.loads(line) for line in heldout_path.read_text(encoding="utf-8").splitlines()]
    evaluate = lambda model: {  # noqa: E731
        mode: satisfaction(
            model, held, greedy=mode == "greedy", max_new_tokens=args.max_new_tokens, min_count=args.min_count
        )
        for mode in ("sampled", "greedy")
    }
    results = {"base": evaluate(args.base_model)}
    print(
        f"[verifiable] base: sampled {results['base']['sampled']['rate']:.3f}, "
        f"greedy {results['base']['greedy']['rate']:.3f}",
        flush=True,
    )
    if args.base_only:
        return 0
    commands = {e: _fit_command(Path(args.config), e, out, train, args) for e in args.estimators}
    (out / "logs").mkdir(parents=True, exist_ok=True)
    timings = Timings()  # each run's wall seconds, from its start to its own exit
    try:  # in parallel, one thread each; a failing run stops the others
        wait_stages(start_stages(commands, out / "logs"), timings)
    except StageFailed as e:
        print(f"[verifiable] FAILED: {e}", file=sys.stderr)
        return e.returncode or 1
    for est in args.estimators:
        results[est] = evaluate(str(out / est / "model"))
        tags = _scalars(out / est / "version_0")
        k = _pick(tags, "objective/kl", "train/objective/kl", "ppo/kl", "kl/mean")
        results[est]["final_kl"] = tags[k][1][-1] if k else None
        parts = [tags[t][1] for t in ("time/generate_s", "time/score_s", "time/train_s") if t in tags]
        results[est]["rollout_s"] = sum(sum(p) for p in parts) / len(parts[0]) if parts else None
    report = write_report(out, results, timings, commands, args)
    (out / "results.json").write_text(json.dumps({"results": results, "timings": dict(timings)}, indent=1))
    print(report.read_text(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

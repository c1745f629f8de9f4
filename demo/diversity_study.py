"""Why PPO's held-out distinct-2 falls: four measurements on a finished demo and its seeds study.

    python -m demo diversity --demo logs/demo --study logs/seeds --out logs/diversity

1. Does the reward model prefer repetition, and does the judge? ``--k`` fresh SFT samples of each of the
   first ``--prompts`` held-out prompts (sampled as PPO samples: T = 1, top-k 0, top-p 1), scored by the RM
   as PPO reads it (``with_eos``) and by the VADER judge:

   a. within-prompt Spearman correlations of each score with the response's own distinct-2, distinct-1
      and word count, and of the RM with the judge (averaged over prompts; also on the demo's best-of-N
      samples, which have 64 per prompt);
   b. interventions: the last third of every response of >= :data:`~demo.diversity_measures.MIN_WORDS`
      words replaced, keeping its word count, by a repeated own bigram (``loop2``), a repeated own 4-word
      phrase (``loop4``; one with no VADER word, ``loop4_neutral``; one with a VADER-positive word,
      ``loop4_positive``), the span before the cut copied once (``dup``), or another prompt's SFT tail
      (``other``, a control without repetition); the change of each score in units of its std over the
      SFT samples.
2. Best-of-N picked by the RM against picked by the judge, from the demo's stored best-of-N samples:
   distinct-2 of the picks (one per prompt) relative to N = 1's, their within / across factors and judge.
3. Where the fall is: distinct-2 of every held-out evaluation of the study (``eval*.json`` of every run
   folder) split into its factors within and across responses (:func:`rlhf_lit.evaluation.distinct_n_factors`),
   each relative to SFT's (the demo's ``eval/sft.json``); the n-grams whose count grew most.
4. Entropy: ``objective/entropy`` over rollouts from each PPO run's TensorBoard logs (windows of
   :data:`~demo.diversity_measures.WINDOW` rollouts, mean +- s.e. over seeds); the rollout entropy at equal
   rollout KL and the held-out distinct-2 at equal KL and judge score, read off lines fitted per variant
   (s.e.: seeds resampled).

Writes ``diversity.json`` (every measurement) and ``diversity.md`` (:mod:`demo.diversity_report`, also
printed) into ``--out``, a folder this command creates (marked by :data:`MARKER`). Standard errors are
``std / sqrt(n)`` (sample std) over the unit each table names: prompts, best-of-N subsets or seeds; the
lines' are the std of the reading over seed resamples (bootstrap). This
module samples, scores and reads the files; the measurements themselves are :mod:`demo.diversity_measures`.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from demo.diversity_measures import (
    EDITS,
    WINDOW,
    edit_effects,
    edited_texts,
    entropy_fall,
    fall_factors,
    grown,
    line_at,
    own_distinct,
    pearson,
    repeats_a_word,
    rollout_windows,
    selection,
    stat,
    within_prompt_spearman,
    word_valence,
)
from demo.plan import ASSETS
from demo.runner import claim_study
from demo.story_prompts import RANGES, load_prompts
from rlhf_lit.artifacts import write_json_atomically, write_text_atomically
from rlhf_lit.evaluation import distinct_n_factors
from rlhf_lit.integrity import check_json_file

MARKER = ".rlhf-lit-diversity.json"
"""Written into ``--out`` when this command creates it; a non-empty folder without it is refused."""
COMMAND = "python -m demo diversity"
AT_KL = (2.0, 2.8)
"""KLs (nats) at which the per-variant lines are read ("-" where a variant's checkpoints do not reach one)."""
AT_JUDGE = (0.70, 0.75)
"""Held-out judge scores at which the lines of distinct-2 against the judge score are read."""


# ------------------------------------------------------------------ 1. repetition: fresh SFT samples
def rm_scores_of(models, prompts: Sequence[str], responses: Sequence[str], batch_size: int = 64) -> list[float]:
    """The RM's score of each prompt + response, re-tokenised as one string with EOS appended (PPO's
    ``with_eos`` reading), so that an edited text and its original are scored the same way."""
    import torch

    from rlhf_lit.functional import pad_ids
    from rlhf_lit.models.reward_ensemble import reward_scores

    tok, scores = models.tokenizer, []
    for s in range(0, len(prompts), batch_size):
        ids = [
            tok(p + r)["input_ids"] + [tok.eos_token_id]
            for p, r in zip(prompts[s : s + batch_size], responses[s : s + batch_size])
        ]
        with torch.no_grad():
            scores += reward_scores(models.reward_model, *pad_ids(ids, tok.pad_token_id, "left")).tolist()
    return scores


def repetition(demo: Path, paragraphs: str, prompts: int, k: int, seed: int, max_new_tokens: int) -> dict:
    """Section 1a and 1b on ``k`` fresh SFT samples of each of the first ``prompts`` held-out prompts."""
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    from rlhf_lit.evaluation.judges import DEFAULT_JUDGE, load_judge
    from rlhf_lit.evaluation.samples import load_models, mean_std, sample_and_measure
    from rlhf_lit.models.generation import SamplingConfig

    judge = load_judge(DEFAULT_JUDGE)
    _, texts = load_prompts(paragraphs, RANGES["eval"][0], prompts, 8)
    models = load_models(
        str(demo / "sft" / "model"), reward_model=str(demo / "reward_model" / "model"), prompts=texts, repeat=k
    )
    samples, seconds = sample_and_measure(
        models,
        models.prompts,
        SamplingConfig(max_new_tokens=max_new_tokens),
        batch_size=64,
        seed=seed,
        unfinished="with_eos",
    )
    responses, rm = samples.responses, samples.rm_scores
    jd = judge(responses)
    prompt_of = [i // k for i in range(len(responses))]
    own = {
        "distinct2_within": [own_distinct(r, 2) for r in responses],
        "distinct1_within": [own_distinct(r, 1) for r in responses],
        "words": [len(r.split()) for r in responses],
    }
    correlation = {
        f"{name}_vs_{x}": within_prompt_spearman(score, values, prompt_of)
        for name, score in (("rm", rm), ("judge", jd))
        for x, values in own.items()
    }
    correlation["rm_vs_judge"] = within_prompt_spearman(rm, jd, prompt_of)

    rescored = rm_scores_of(models, samples.prompts, responses)  # the edits' baseline, scored as they are
    rm_std, judge_std = mean_std(rm)[1], mean_std(jd)[1]
    valence = word_valence(SentimentIntensityAnalyzer().lexicon)  # the lexicon the judge reads
    rows, edited = edited_texts(responses, prompt_of, random.Random(seed), valence)
    edits = {}
    for name in EDITS:
        kept = [(i, text) for i, text in zip(rows, edited[name]) if text is not None]
        rm_e = rm_scores_of(models, [samples.prompts[i] for i, _ in kept], [t for _, t in kept])
        jd_e = judge([t for _, t in kept])
        edits[name] = edit_effects(
            [prompt_of[i] for i, _ in kept],
            [(e - rescored[i]) / rm_std for (i, _), e in zip(kept, rm_e)],
            [(e - jd[i]) / judge_std for (i, _), e in zip(kept, jd_e)],
            [own_distinct(t, 2) - own["distinct2_within"][i] for i, t in kept],
        )
    d2_own = [d for d in own["distinct2_within"] if d is not None]
    return {
        "samples": {
            "responses": len(responses),
            "prompts": prompts,
            "k": k,
            "sampling_seconds": seconds,
            "words_mean": sum(own["words"]) / len(responses),
            "distinct2_within_mean": sum(d2_own) / len(d2_own),
            "fraction_repeating_a_bigram": sum(d < 1 for d in d2_own) / len(responses),
            "rm_std": rm_std,
            "judge_std": judge_std,
            "rescored_rm_correlation": pearson(rm, rescored),
        },
        "correlation": correlation,
        "intervention": {"edited_responses": len(rows), "edits": edits},
    }


# ------------------------------------------------------------------ 2. best-of-N samples the demo stored
def best_of_n_section(demo: Path) -> dict:
    """Best-of-N by the RM and by the judge (:func:`~demo.diversity_measures.selection`) on the demo's stored
    best-of-N samples, and section 1a's correlations with own distinct-2 on them (64 samples per prompt)."""
    stored = check_json_file(demo / "best_of_n" / "best_of_n.json")
    by_prompt: dict[int, list[dict]] = {}
    for s in sorted(stored["samples"], key=lambda s: (s["prompt_index"], s["sample_index"])):
        by_prompt.setdefault(s["prompt_index"], []).append(s)
    flat = [s for samples in by_prompt.values() for s in samples]
    prompt_of = [s["prompt_index"] for s in flat]
    own = [own_distinct(s["response"], 2) for s in flat]
    result = selection(list(by_prompt.values()), [row["n"] for row in stored["rows"]])
    for row in stored["rows"]:
        result["by_n"][str(row["n"])]["kl_analytic"] = row["kl_analytic"]
    return {
        "prompts": len(by_prompt),
        "samples": len(flat),
        **result,
        "correlation": {
            f"{key}_vs_distinct2_within": within_prompt_spearman([s[key] for s in flat], own, prompt_of)
            for key in ("rm", "judge")
        },
    }


# ------------------------------------------------------------------ 3. the seeds study's held-out evaluations
def study_variants(study: Path) -> list[tuple[str, str, list[Path]]]:
    """``(name, method, run folders by seed)`` of every variant of a ``python -m demo seeds`` folder, in its
    ``study.json``'s order: the PPO variants, then DPO's betas (``dpo/beta_<b>``)."""
    summary = check_json_file(study / "study.json")
    named = [(name, "ppo") for name in summary["ppo"]] + [(f"dpo/{name}", "dpo") for name in summary["dpo"]]
    return [
        (name, method, sorted((study / name).glob("seed_*"), key=lambda p: int(p.name.removeprefix("seed_"))))
        for name, method in named
    ]


def run_evaluations(run: Path) -> dict[str, Path]:
    """A run's held-out evaluations by checkpoint: ``eval_rollout_<r>.json`` as ``"<r>"`` (in rollout order),
    then ``eval.json`` (the run's export) as ``"final"``."""
    rollouts = {int(p.stem.removeprefix("eval_rollout_")): p for p in run.glob("eval_rollout_*.json")}
    final = {"final": run / "eval.json"} if (run / "eval.json").exists() else {}
    return {**{str(r): rollouts[r] for r in sorted(rollouts)}, **final}


def decomposition_section(variants: Sequence[tuple[str, str, list[Path]]], sft_texts: Sequence[str]) -> dict:
    """Every evaluation's distinct-2 over SFT's, split within / across (:func:`~demo.diversity_measures.fall_factors`),
    mean +- s.e. over seeds per checkpoint; the words and bigrams that grew most in the final policies; and,
    per PPO variant, distinct-2 over SFT's read at equal KL and equal judge score on lines through all checkpoints."""
    within, across = distinct_n_factors(sft_texts, 2)
    out = {
        "sft": {
            "distinct_2": within * across,
            "within": within,
            "across": across,
            "repeats_a_word": repeats_a_word(sft_texts),
        },
        "variants": {},
    }
    for name, method, runs in variants:
        by_checkpoint: dict[str, list[dict]] = {}
        finals, points = [], []  # final responses per seed; (KL, judge, d2 ratio) of every checkpoint per seed
        for run in runs:
            points.append([])
            for checkpoint, path in run_evaluations(run).items():
                evaluation = check_json_file(path)
                texts = [s["response"] for s in evaluation["samples"]]
                if len(texts) != len(sft_texts):  # distinct-2 falls with the number of texts pooled
                    raise ValueError(f"{path} holds {len(texts)} responses, the SFT evaluation {len(sft_texts)}")
                row = {
                    "kl": evaluation["metrics"]["kl_mean"],
                    "judge": evaluation["metrics"]["judge_mean"],
                    **fall_factors(texts, (within, across)),
                }
                by_checkpoint.setdefault(checkpoint, []).append(row)
                points[-1].append((row["kl"], row["judge"], row["d2_ratio"]))
                finals += [texts] if checkpoint == "final" else []
        variant = {
            "checkpoints": {c: {k: stat([r[k] for r in rows]) for k in rows[0]} for c, rows in by_checkpoint.items()},
            "grown_bigrams": grown(finals, sft_texts, 2),
            "grown_words": grown(finals, sft_texts, 1),
            "repeats_a_word": repeats_a_word([t for texts in finals for t in texts]),
        }
        if method == "ppo":
            variant["d2_ratio_at_kl"] = line_at([([p[0] for p in s], [p[2] for p in s]) for s in points], AT_KL)
            variant["d2_ratio_at_judge"] = line_at([([p[1] for p in s], [p[2] for p in s]) for s in points], AT_JUDGE)
        out["variants"][name] = variant
    return out


# ------------------------------------------------------------------ 4. entropy over rollouts
def entropy_section(variants: Sequence[tuple[str, str, list[Path]]]) -> dict:
    """Per PPO variant, from each seed's TensorBoard logs: ``objective/entropy`` at rollout 1 and in windows
    (:func:`~demo.diversity_measures.rollout_windows`), its fall from the first to the last window (also per
    nat of rollout KL), and the entropy read at equal rollout KL on a line through rollouts after the first window."""
    from demo.report import read_scalars

    out = {}
    for name, method, runs in variants:
        if method != "ppo":
            continue
        scalars = [read_scalars(str(run / "tb" / "version_0")) for run in runs]
        entropy = [s["objective/entropy"][1] for s in scalars]
        kl = [s["objective/kl"][1] for s in scalars]
        windows = [rollout_windows(e) for e in entropy]
        falls = [entropy_fall(e, k) for e, k in zip(entropy, kl)]
        out[name] = {
            "windows": {r: stat([w[r] for w in windows]) for r in windows[0] if all(r in w for w in windows)},
            "fall": stat([f for f, _ in falls]),
            "fall_per_nat": stat([f for _, f in falls]),
            "at_kl": line_at([(k[WINDOW:], e[WINDOW:]) for e, k in zip(entropy, kl)], AT_KL),
        }
    return out


# ------------------------------------------------------------------ the command
def build_parser() -> argparse.ArgumentParser:
    """Options of ``python -m demo diversity``."""
    p = argparse.ArgumentParser(
        prog=COMMAND, description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--demo",
        required=True,
        help="a finished `make demo` folder (its SFT model, RM, best-of-N samples and SFT evaluation)",
    )
    p.add_argument("--study", required=True, help="a `python -m demo seeds` output folder of that demo")
    p.add_argument("--out", required=True, help="folder for diversity.json and diversity.md")
    p.add_argument("--prompts", type=int, default=256, help="held-out prompts sampled (the first of the eval range)")
    p.add_argument("--k", type=int, default=8, help="SFT samples per prompt")
    p.add_argument("--seed", type=int, default=0, help="sampling seed, also of the edits' random choices")
    p.add_argument(
        "--paragraphs",
        default=str(ASSETS / "data" / "tinystories" / "val.txt"),
        help="the held-out stories (the demo's TinyStories val.txt)",
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=48,
        help="most tokens per sampled response: keep it PPO's sampling.max_new_tokens",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the study; exit status 2 on a refused ``--out``, a bad option or a missing input."""
    from transformers.utils import logging as hf_logging

    from demo.diversity_report import markdown

    args = build_parser().parse_args(argv)
    hf_logging.disable_progress_bar()
    demo, study, out = Path(args.demo), Path(args.study), Path(args.out)
    for need in (
        demo / "sft" / "model",
        demo / "reward_model" / "model",
        demo / "best_of_n" / "best_of_n.json",
        demo / "eval" / "sft.json",
        study / "study.json",
    ):
        if not need.exists():
            print(
                f"error: {need} is missing: --demo takes a finished `make demo` folder, --study a finished "
                "`python -m demo seeds` folder",
                file=sys.stderr,
            )
            return 2
    if args.prompts < 2 or args.k < 2:
        print(
            "error: --prompts and --k must be >= 2 (correlations compare responses of a prompt, the "
            "'other' edit takes another prompt's)",
            file=sys.stderr,
        )
        return 2
    try:
        claim_study(out, MARKER, COMMAND)
    except FileExistsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    variants = study_variants(study)
    sft_texts = [s["response"] for s in check_json_file(demo / "eval" / "sft.json")["samples"]]
    result = {
        "config": {
            "demo": str(demo),
            "study": str(study),
            "prompts": args.prompts,
            "k": args.k,
            "seed": args.seed,
            "paragraphs": args.paragraphs,
            "max_new_tokens": args.max_new_tokens,
            "edits": list(EDITS),
            "at_kl": list(AT_KL),
            "at_judge": list(AT_JUDGE),
            "window": WINDOW,
        },
        "repetition": repetition(demo, args.paragraphs, args.prompts, args.k, args.seed, args.max_new_tokens),
        "best_of_n": best_of_n_section(demo),
        "decomposition": decomposition_section(variants, sft_texts),
        "entropy": entropy_section(variants),
    }
    result["seconds"] = time.perf_counter() - t0
    write_json_atomically(out / "diversity.json", result)
    text = markdown(result)
    write_text_atomically(out / "diversity.md", text)
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

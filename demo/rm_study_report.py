"""The report of ``python -m demo rm-study``: held-out RM accuracy per variant over seeds.

Given the runs' ``result.json`` contents (:func:`demo.rm_study.run_one`) and the study's
setup, :func:`write_study` writes ``study.json`` (:func:`summarise`'s numbers) and ``study.md``:
per variant the training data's size, the held-out pair accuracy after the last epoch (and after
each epoch), the held-out loss and the training wall time, as mean +- standard error over seeds
(:func:`demo.seeds_report.mean_se`), then every seed's row.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

from demo.seeds_report import mean_se

COUNTS = ("records", "comparisons", "sequences")
"""The training data's size per run: records written, the comparisons they hold, responses per epoch."""


def summarise(results: Sequence[Mapping]) -> dict[str, dict]:
    """Per variant (in first-seen order): the seeds, mean and standard error of each measurement.

    Measurements: ``accuracy`` and ``loss`` (the held-out ``val/accuracy`` and ``val/loss`` after the
    last epoch), ``accuracy_by_epoch`` (a list, one entry per epoch), ``fit_seconds`` and the
    :data:`COUNTS`.
    """
    by_variant: dict[str, list[Mapping]] = {}
    for result in results:
        by_variant.setdefault(result["variant"], []).append(result)
    summary = {}
    for variant, rows in by_variant.items():
        epochs = min(len(r["val"]["val/accuracy"]) for r in rows)
        entry = {
            "seeds": [r["seed"] for r in rows],
            "accuracy": mean_se([r["val"]["val/accuracy"][-1] for r in rows]),
            "loss": mean_se([r["val"]["val/loss"][-1] for r in rows]),
            "accuracy_by_epoch": [mean_se([r["val"]["val/accuracy"][e] for r in rows]) for e in range(epochs)],
            "fit_seconds": mean_se([r["fit_seconds"] for r in rows]),
        }
        entry.update({key: mean_se([r["counts"][key] for r in rows]) for key in COUNTS})
        summary[variant] = entry
    return summary


def markdown(results: Sequence[Mapping], summary: Mapping[str, Mapping], setup: Mapping) -> str:
    """``study.md``: the setup, the table over seeds and the per-seed rows."""
    lo, hi = setup["heldout_paragraphs"]
    lines = [
        "# Rankings against pairs: RM held-out pair accuracy",
        "",
        f"Command: `{setup['command']}`",
        "",
        f"Machine: {setup['machine']}.",
        "",
        f"Per seed: {setup['train_prompts']} prompts (paragraphs {setup['train_paragraphs'][0]}-"
        f"{setup['train_paragraphs'][1] - 1}), K = {setup['samples_per_prompt']} SFT samples each, "
        f"{setup['judge_calls_per_seed']} judge calls, shared by every variant. Held-out set: "
        f"{setup['heldout_pairs']} judge-labelled pairs (all untied pairs of K samples, sampling seed "
        f"{setup['heldout_seed']}) of paragraphs {lo}-{hi - 1}, the same for every run. "
        f"Sampling and judging took {_seconds(setup['sampling_seconds'].values())} s per seed (wall) and "
        f"{setup['heldout_sampling_seconds']:.0f} s for the held-out set; every RM fit's wall time is in "
        f"the tables; this invocation (finished runs reused) took {setup['wall_seconds']:.0f} s.",
        "",
        "Mean ± standard error over seeds (accuracy and loss on the held-out pairs after the last epoch):",
        "",
        "| variant | seeds | records | comparisons | sequences / epoch | accuracy | accuracy by epoch | loss | fit wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for variant, entry in summary.items():
        by_epoch = " / ".join(f"{m:.3f}" for m, _ in entry["accuracy_by_epoch"])
        lines.append(
            f"| {variant} | {len(entry['seeds'])} | {entry['records'][0]:.0f} | {entry['comparisons'][0]:.0f} | "
            f"{entry['sequences'][0]:.0f} | {_fmt(entry['accuracy'])} | {by_epoch} | {_fmt(entry['loss'])} | "
            f"{entry['fit_seconds'][0]:.0f} |"
        )
    lines += [
        "",
        "Per seed:",
        "",
        "| variant | seed | records | comparisons | accuracy by epoch | loss | fit wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        by_epoch = " / ".join(f"{a:.3f}" for a in r["val"]["val/accuracy"])
        lines.append(
            f"| {r['variant']} | {r['seed']} | {r['counts']['records']} | {r['counts']['comparisons']} | "
            f"{by_epoch} | {r['val']['val/loss'][-1]:.4f} | {r['fit_seconds']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def _seconds(values) -> str:
    return " / ".join(f"{v:.0f}" for v in values)


def _fmt(mean_and_se: tuple[float, float | None]) -> str:
    mean, se = mean_and_se
    return f"{mean:.3f}" if se is None else f"{mean:.3f} ± {se:.3f}"


def write_study(results: Sequence[Mapping], setup: Mapping, out_dir: str) -> str:
    """Write ``study.json`` and ``study.md`` into ``out_dir``; returns the markdown's path."""
    from rlhf_lit.artifacts import write_text_atomically

    summary = summarise(results)
    write_text_atomically(
        os.path.join(out_dir, "study.json"),
        json.dumps({"setup": setup, "summary": summary, "runs": list(results)}, indent=1),
    )
    path = os.path.join(out_dir, "study.md")
    write_text_atomically(path, markdown(results, summary, setup))
    return path

"""The report of ``python -m demo seeds``: means and standard errors over seeds, plots.

Given the runs' ``result.json`` contents (:func:`demo.seeds.run_job`) and the SFT model's
held-out evaluation, :func:`write_study` writes into the study folder:

- ``study.json``: :func:`summarise`'s numbers;
- ``study.md``: per PPO variant, per seed, the shaped objective ``objective/rlhf_reward`` (mean of
  the first and of the last :data:`WINDOW` rollouts), the held-out judge score, KL, distinct-2,
  length, and DPO's judge score at the same KL (:func:`dpo_at`); then the means +- standard errors
  over seeds, and the DPO sweep;
- ``curves.png``: ``objective/rlhf_reward``, ``objective/scores`` and ``objective/kl`` per rollout,
  each variant's mean over seeds with a band of +- 1 standard error;
- ``frontier.png``: held-out judge score against KL, the mean over seeds of every PPO checkpoint, DPO
  beta and BoNBoN N (error bars: standard error over seeds), SFT, and best-of-N: the study's sweeps (mean
  over seeds) or else the demo folder's;
- with BoNBoN runs or sweeps, their tables (:mod:`demo.seeds_frontier`): every DPO and BoNBoN policy's
  judge score minus best-of-N's at the same KL, distinct-2 over SFT's, and cost.

Standard errors are over seeds (``std / sqrt(n)``, sample std); with one seed there is none.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

from demo.seed_stats import interpolate, mean_se, over_seeds
from rlhf_lit.integrity import check_json_file

CURVE_TAGS = ("objective/rlhf_reward", "objective/scores", "objective/kl")
"""The per-rollout scalars kept from each PPO run (:func:`demo.seeds.run_job`) and drawn in ``curves.png``."""
WINDOW = 5
"""Rollouts averaged at each end of a run for the rise of the shaped objective."""
METRICS = ("judge_mean", "kl_mean", "distinct_2", "length_mean", "ended_fraction")
"""Held-out measurements summarised over seeds."""


def dpo_at(dpo_points: Sequence[tuple[float, float]], sft_judge: float, kl: float) -> float | None:
    """DPO's judge score at ``kl``: interpolated along SFT (KL 0) and the DPO policies of one seed."""
    return interpolate([(0.0, sft_judge), *dpo_points], kl)


def _against_best_of_n(metrics: Mapping, bon: Sequence[tuple[float, float]]) -> dict:
    """Best-of-N's judge score at ``metrics``' KL and the policy's judge score minus it (empty outside N's range)."""
    at = interpolate(bon, metrics["kl_mean"]) if bon else None
    return {} if at is None else {"bon_judge_at_kl": at, "judge_minus_bon": metrics["judge_mean"] - at}


def _rise(curve: Sequence[float]) -> dict[str, float]:
    first, last = curve[:WINDOW], curve[-WINDOW:]
    return {
        "first": sum(first) / len(first),
        "last": sum(last) / len(last),
        "rise": sum(last) / len(last) - sum(first) / len(first),
    }


def _final(result: Mapping) -> dict:
    """The held-out metrics of a run's last evaluation (its export)."""
    evaluations = result["evaluations"]
    last = max(evaluations, key=lambda k: float("inf") if k == "final" else int(k))
    return evaluations[last]


def best_of_n_curve(best_of_n: Mapping) -> list[tuple[float, float]]:
    """``(KL, judge)`` of each N of an ``rlhf-lit best-of-n`` result (the analytic KL, log N - (N-1)/N)."""
    return [(row["kl_analytic"], row["judge_mean"]) for row in best_of_n["rows"] if row.get("judge_mean") is not None]


def summarise(results: Sequence[Mapping], sft: Mapping, best_of_n: Mapping | None = None) -> dict:
    """Per PPO variant and DPO beta: per-seed rows and their means +- standard errors over seeds.

    Args:
        results: the ``result.json`` contents of every run.
        sft: the SFT model's held-out metrics (``judge_mean``, ``distinct_2``, ...).
        best_of_n: the demo's ``rlhf-lit best-of-n`` result: each PPO evaluation is then compared
            with best-of-N at its KL (interpolated between N points, never extrapolated).
    """
    bon = best_of_n_curve(best_of_n) if best_of_n is not None else []
    dpo: dict[str, list[Mapping]] = {}
    for r in results:
        if r["method"] == "dpo":
            dpo.setdefault(r["name"], []).append(r)
    dpo_by_seed: dict[int, list[tuple[float, float]]] = {}
    for runs in dpo.values():
        for r in runs:
            final = _final(r)
            dpo_by_seed.setdefault(r["seed"], []).append((final["kl_mean"], final["judge_mean"]))
    variants: dict[str, dict] = {}
    for r in results:
        if r["method"] != "ppo":
            continue
        final = _final(r)
        row = {"seed": r["seed"], **{k: final[k] for k in METRICS}}
        row.update({f"objective_{k}": v for k, v in _rise(r["curves"]["objective/rlhf_reward"]).items()})
        row["judge_gain"] = final["judge_mean"] - sft["judge_mean"]
        row["distinct_2_ratio"] = final["distinct_2"] / sft["distinct_2"]
        if r["seed"] in dpo_by_seed:
            row["dpo_judge_at_kl"] = dpo_at(dpo_by_seed[r["seed"]], sft["judge_mean"], final["kl_mean"])
            if row["dpo_judge_at_kl"] is not None:
                row["judge_minus_dpo"] = final["judge_mean"] - row["dpo_judge_at_kl"]
        row.update(_against_best_of_n(final, bon))
        variant = variants.setdefault(r["name"], {"overrides": r["overrides"], "seeds": [], "checkpoints": {}})
        variant["seeds"].append(row)
        for rollout, metrics in r["evaluations"].items():
            variant["checkpoints"].setdefault(str(rollout), []).append({**metrics, **_against_best_of_n(metrics, bon)})
    keys = [
        *METRICS,
        "objective_first",
        "objective_last",
        "objective_rise",
        "judge_gain",
        "distinct_2_ratio",
        "dpo_judge_at_kl",
        "judge_minus_dpo",
        "bon_judge_at_kl",
        "judge_minus_bon",
    ]
    for variant in variants.values():
        variant["seeds"].sort(key=lambda row: row["seed"])
        variant["mean"] = over_seeds(variant["seeds"], keys)
        variant["checkpoints"] = {
            k: over_seeds(v, ("judge_mean", "kl_mean", "distinct_2", "judge_minus_bon"))
            for k, v in sorted(variant["checkpoints"].items(), key=lambda kv: int(kv[0]))
        }
    dpo_summary = {name: over_seeds([_final(r) for r in runs], METRICS) for name, runs in dpo.items()}
    return {"sft": {k: sft[k] for k in METRICS}, "window": WINDOW, "ppo": variants, "dpo": dpo_summary}


def _pm(stat: Mapping | None, digits: int = 3) -> str:
    if stat is None:
        return "-"
    se = "" if stat["se"] is None else f" +- {stat['se']:.{digits}f}"
    return f"{stat['mean']:.{digits}f}{se}"


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(summary: Mapping) -> list[str]:
    """The tables of ``study.md``."""
    sft = summary["sft"]
    w = summary["window"]
    lines = [
        f"SFT: judge {sft['judge_mean']:.3f}, distinct-2 {sft['distinct_2']:.3f}, length {sft['length_mean']:.1f}.",
        "",
    ]
    for name, v in summary["ppo"].items():
        lines += [
            f"## PPO `{name}`" + (f": `{' '.join(v['overrides'])}`" if v["overrides"] else " (the config as it is)"),
            "",
            f"| seed | rlhf_reward first {w} | last {w} | rise | judge | KL | distinct-2 | length | ended | DPO judge at this KL |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in v["seeds"]:
            lines.append(
                f"| {row['seed']} | {row['objective_first']:+.3f} | {row['objective_last']:+.3f} | {row['objective_rise']:+.3f} "
                f"| {row['judge_mean']:.3f} | {row['kl_mean']:.2f} | {row['distinct_2']:.3f} | {row['length_mean']:.1f} "
                f"| {row['ended_fraction']:.2f} | {_num(row.get('dpo_judge_at_kl'))} |"
            )
        m = v["mean"]
        lines += [
            f"| **mean +- s.e.** | {_pm(m.get('objective_first'))} | {_pm(m.get('objective_last'))} | {_pm(m.get('objective_rise'))} "
            f"| {_pm(m.get('judge_mean'))} | {_pm(m.get('kl_mean'), 2)} | {_pm(m.get('distinct_2'))} "
            f"| {_pm(m.get('length_mean'), 1)} | {_pm(m.get('ended_fraction'), 2)} | {_pm(m.get('dpo_judge_at_kl'))} |",
            "",
            f"Judge gain over SFT {_pm(m.get('judge_gain'))}; distinct-2 / SFT's {_pm(m.get('distinct_2_ratio'))}; "
            f"judge minus DPO's at the same KL {_pm(m.get('judge_minus_dpo'))} (per seed, DPO of the same seed); "
            f"judge minus best-of-N's at the same KL {_pm(m.get('judge_minus_bon'))} (the demo's best-of-N, "
            "interpolated between its N).",
            "",
            "Along training (held-out, mean +- s.e. over seeds): "
            + "; ".join(
                f"rollout {k}: judge {_pm(c.get('judge_mean'))} at {_pm(c.get('kl_mean'), 2)} nats, "
                f"distinct-2 {_pm(c.get('distinct_2'))}, minus best-of-N {_pm(c.get('judge_minus_bon'))}"
                for k, c in v["checkpoints"].items()
            )
            + ".",
            "",
        ]
    if summary["dpo"]:
        lines += ["## DPO", "", "| beta | judge | KL | distinct-2 | length |", "|---|---|---|---|---|"]
        for name, m in summary["dpo"].items():
            lines.append(
                f"| {name.removeprefix('beta_')} | {_pm(m.get('judge_mean'))} | {_pm(m.get('kl_mean'), 2)} "
                f"| {_pm(m.get('distinct_2'))} | {_pm(m.get('length_mean'), 1)} |"
            )
        lines.append("")
    return lines


def draw_curves(results: Sequence[Mapping], path: str, order: Sequence[str]) -> str:
    """``curves.png``: the shaped objective, the RM score and the KL per rollout, mean +- s.e. over seeds."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 3.6), dpi=100)
    FigureCanvasAgg(fig)
    titles = {
        "objective/rlhf_reward": "shaped objective (score - beta KL)",
        "objective/scores": "RM score",
        "objective/kl": "KL per response (nats)",
    }
    for i, tag in enumerate(CURVE_TAGS):
        ax = fig.add_subplot(1, len(CURVE_TAGS), i + 1)
        for c, name in enumerate(order):
            curves = [r["curves"][tag] for r in results if r["method"] == "ppo" and r["name"] == name]
            length = min(len(curve) for curve in curves)
            stats = [mean_se([curve[t] for curve in curves]) for t in range(length)]
            means = [m for m, _ in stats]
            ses = [0.0 if se is None else se for _, se in stats]
            ax.plot(range(length), means, color=f"C{c}", label=f"{name} ({len(curves)} seeds)")
            ax.fill_between(
                range(length),
                [m - s for m, s in zip(means, ses)],
                [m + s for m, s in zip(means, ses)],
                color=f"C{c}",
                alpha=0.25,
                linewidth=0,
            )
        ax.set(title=titles[tag], xlabel="rollout")
        ax.grid(alpha=0.3)
        if i == 0:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    return path


def frontier_points(summary: Mapping, best_of_n: Mapping | None):
    """:class:`~demo.frontier.FrontierPoint` s of the seed means (best-of-N: the study's sweeps over seeds, else
    the demo's own run)."""
    from demo.frontier import FrontierPoint, points_from_best_of_n

    def point(method: str, setting: str, stats: Mapping) -> FrontierPoint:
        judge = stats["judge_mean"]
        return FrontierPoint(
            method,
            setting,
            kl=stats["kl_mean"]["mean"],
            score=judge["mean"],
            score_se=judge["se"] or 0.0,
            n=judge["n"],
            note="mean over seeds",
        )

    points = [FrontierPoint("SFT", "-", 0.0, summary["sft"]["judge_mean"], 0.0, 1)]
    for name, v in summary["ppo"].items():
        points += [point(f"PPO {name}", f"rollout {k}", c) for k, c in v["checkpoints"].items()]
    points += [point("DPO", f"beta {name.removeprefix('beta_')}", m) for name, m in summary["dpo"].items()]
    bonbon = summary.get("pair_methods", {}).get("bonbon", {})
    points += [point("BoNBoN", f"N = {name.removeprefix('n_')}", e["mean"]) for name, e in bonbon.items()]
    sweeps = summary.get("best_of_n_seeds") or {}
    if sweeps:
        points += [
            FrontierPoint(
                "best-of-N",
                f"N = {n}",
                kl=v["kl"],
                score=v["judge_mean"]["mean"],
                score_se=v["judge_mean"]["se"] or 0.0,
                n=v["judge_mean"]["n"],
                kl_analytic=True,
                note="mean over seeds",
            )
            for n, v in sweeps.items()
        ]
    elif best_of_n is not None:
        points += points_from_best_of_n(best_of_n)
    return points


def write_study(
    results: Sequence[Mapping],
    sft: Mapping,
    out_dir: str,
    best_of_n: str | None = None,
    baseline: str | None = None,
    sweeps: Sequence[Mapping] = (),
) -> str:
    """``study.json``, ``study.md``, ``curves.png`` and ``frontier.png`` in ``out_dir``; returns the ``.md`` path.

    ``sweeps``: the study's own best-of-N sweeps (``result.json`` of its ``best_of_n`` jobs), whose mean over
    seeds replaces the demo folder's ``best_of_n`` as the curve every policy is compared with.
    """
    from demo import seeds_frontier
    from demo.frontier import draw_frontier

    bon = None
    by_n = seeds_frontier.best_of_n_over_seeds(sweeps) if sweeps else {}
    if by_n:  # the sweeps' mean judge score at each N, read as one best-of-N result
        bon = {"rows": [{"kl_analytic": v["kl"], "judge_mean": v["judge_mean"]["mean"]} for v in by_n.values()]}
    elif best_of_n is not None:
        bon = check_json_file(best_of_n, want_object=False)
    summary = summarise([r for r in results if r["method"] != "bonbon"], sft, bon)
    curve = best_of_n_curve(bon) if bon is not None else []
    summary["pair_methods"] = seeds_frontier.pair_methods(results, summary["sft"], curve)
    summary["best_of_n_seeds"] = by_n
    with open(os.path.join(out_dir, "study.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    order = list(summary["ppo"])
    if baseline is not None:
        if baseline not in order:
            raise ValueError(f"--baseline {baseline!r} is not a variant of the study ({', '.join(order)})")
        order = [baseline, *(name for name in order if name != baseline)]
    figures = []
    if order:
        figures.append(
            f"![curves]({os.path.basename(draw_curves(results, os.path.join(out_dir, 'curves.png'), order))})"
        )
    png = draw_frontier(
        frontier_points(summary, bon),
        os.path.join(out_dir, "frontier.png"),
        title="Judge score against KL to SFT (mean over seeds)",
    )
    figures.append(f"![frontier]({os.path.basename(png)})")
    path = os.path.join(out_dir, "study.md")
    with open(path, "w", encoding="utf-8") as f:
        extra = seeds_frontier.markdown(summary["pair_methods"], summary["best_of_n_seeds"])
        f.write("\n".join(["# Seeds study", "", *markdown(summary), *extra, *figures, ""]))
    return path

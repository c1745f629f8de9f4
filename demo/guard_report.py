"""The report of ``python -m demo guard``: the export with and without ``keep_best``, and a plot.

Given the runs' ``result.json`` contents (:func:`demo.guard_study.run_seed`),
:func:`write_study` writes into the study folder:

- ``study.json``: :func:`summarise`'s numbers: per seed the held-out judge score and KL to SFT of
  the exported policy (``keep_best``) and of the last one (the export without ``keep_best``), the KL
  saved (last minus exported), the kept rollout and the rollouts where each signal fired; the means
  +- standard errors over seeds;
- ``study.md``: the same as tables;
- ``guard.png``: per seed, the proxy's score (``objective/scores``) and the judge's
  (``objective/judge``) per rollout, the guard's held-out judge, the rollouts where each signal
  fired and the kept policy.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

from demo.seeds_report import mean_se

MEASURED = ("judge_mean", "kl_mean", "distinct_2", "length_mean")
"""Held-out measurements of each policy shown in the tables."""


def seed_row(result: Mapping) -> dict:
    """One seed's numbers: both policies' measurements, the KL saved and when each signal fired."""
    exported, last = result["exported"], result["last"]
    row = {"seed": result["seed"], "kept_rollout": result["kept_rollout"], "fired": dict(result["fired"])}
    for key in MEASURED:
        row[f"export_{key}"], row[f"last_{key}"] = exported[key], last[key]
    row["kl_saved"] = last["kl_mean"] - exported["kl_mean"]
    row["judge_change"] = exported["judge_mean"] - last["judge_mean"]
    return row


def summarise(results: Sequence[Mapping], settings: Mapping) -> dict:
    """Per-seed rows and their means +- standard errors (sample std / sqrt(n); none for one seed)."""
    rows = [seed_row(r) for r in sorted(results, key=lambda r: r["seed"])]
    keys = [k for k in rows[0] if k not in ("seed", "kept_rollout", "fired")] if rows else []
    mean = {}
    for key in keys:
        m, se = mean_se([row[key] for row in rows])
        mean[key] = {"mean": m, "se": se, "n": len(rows)}
    return {"settings": dict(settings), "seeds": rows, "mean": mean}


def _pm(stat: Mapping, digits: int = 3) -> str:
    se = "" if stat["se"] is None else f" ± {stat['se']:.{digits}f}"
    return f"{stat['mean']:.{digits}f}{se}"


def _rollouts(values: Sequence[int]) -> str:
    return ", ".join(str(v) for v in values) if values else "never"


def markdown(summary: Mapping) -> list[str]:
    """``study.md``'s tables."""
    s = summary["settings"]
    lines = [
        f"Proxy RM: {s.get('proxy_pairs')} demo pairs relabelled by Bradley-Terry (temperature "
        f"{s.get('bt_temperature')}); PPO: KL coefficient {s.get('kl_coef')}, {s.get('rollouts')} rollouts; "
        f"guard held-out evaluation every {s.get('held_out_every')} rollouts. Measured on "
        f"{s.get('eval_count')} held-out prompts (the demo's evaluation).",
        "",
        "| seed | kept rollout | judge: export (keep_best) | judge: last | KL: export | KL: last | KL saved |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in summary["seeds"]:
        kept = "last (never fired)" if r["kept_rollout"] is None else str(r["kept_rollout"])
        lines.append(
            f"| {r['seed']} | {kept} | {r['export_judge_mean']:.3f} | {r['last_judge_mean']:.3f} | "
            f"{r['export_kl_mean']:.2f} | {r['last_kl_mean']:.2f} | {r['kl_saved']:.2f} |"
        )
    m = summary["mean"]
    if m:
        lines.append(
            f"| mean ± s.e. | | {_pm(m['export_judge_mean'])} | {_pm(m['last_judge_mean'])} | "
            f"{_pm(m['export_kl_mean'], 2)} | {_pm(m['last_kl_mean'], 2)} | {_pm(m['kl_saved'], 2)} |"
        )
    signals = sorted({name for r in summary["seeds"] for name in r["fired"]})
    lines += [
        "",
        "Rollouts after which each signal acted:",
        "",
        "| seed | " + " | ".join(signals) + " |",
        "|---|" + "---|" * len(signals),
    ]
    for r in summary["seeds"]:
        lines.append(f"| {r['seed']} | " + " | ".join(_rollouts(r["fired"][n]) for n in signals) + " |")
    return lines + [""]


def draw(results: Sequence[Mapping], path: str) -> str:
    """``guard.png``: per seed (columns), proxy score (top) and judge score (bottom) per rollout, with
    the guard's held-out judge, a line at each rollout a signal acted and a star at the kept policy."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    results = sorted(results, key=lambda r: r["seed"])
    fig = Figure(figsize=(max(4.2 * len(results), 7.0), 6.0), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, len(results), squeeze=False, sharex=True)
    styles = {
        "proxy_gold": ("C3", "-"),
        "kl": ("C1", "--"),
        "distinct": ("C4", ":"),
        "length": ("C5", "-."),
        "objective": ("C6", (0, (1, 3))),
    }
    for col, r in enumerate(results):
        top, bottom = axes[0][col], axes[1][col]
        scores, judge = r["curves"].get("objective/scores", []), r["curves"].get("objective/judge", [])
        top.plot(range(1, len(scores) + 1), scores, color="C0", label="proxy RM score (rollout)")
        bottom.plot(range(1, len(judge) + 1), judge, color="C2", label="judge (rollout)")
        held = r["held_out"]
        top.plot(held["rollouts"], held["score"], "o", color="C0", ms=4, label="proxy, guard held-out")
        bottom.plot(held["rollouts"], held["judge"], "o", color="C2", ms=4, label="judge, guard held-out")
        for name, rollouts in r["fired"].items():
            color, style = styles.get(name, ("k", "-"))
            for i, n in enumerate(rollouts):
                for ax in (top, bottom):
                    ax.axvline(
                        n, color=color, linestyle=style, linewidth=1.2, label=f"{name} fired" if i == 0 else None
                    )
        if r["kept_rollout"] is not None and r["kept_rollout"] in held["rollouts"]:
            k = held["rollouts"].index(r["kept_rollout"])
            bottom.plot([r["kept_rollout"]], [held["judge"][k]], "*", color="k", ms=13, label="kept (exported)")
        top.set(title=f"seed {r['seed']}", ylabel="proxy RM score" if col == 0 else None)
        bottom.set(xlabel="rollout", ylabel="judge (VADER)" if col == 0 else None)
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
        if col == 0:
            top.legend(fontsize=7, loc="lower right")
            bottom.legend(fontsize=7, loc="lower right")
    fig.suptitle("Proxy against judge per rollout, and where the over-optimisation guard fired")
    fig.tight_layout()
    fig.savefig(path)
    return path


def write_study(results: Sequence[Mapping], settings: Mapping, out_dir: str) -> str:
    """``study.json``, ``study.md`` and ``guard.png`` in ``out_dir``; returns the ``.md`` path."""
    summary = summarise(results, settings)
    with open(os.path.join(out_dir, "study.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    png = draw(results, os.path.join(out_dir, "guard.png"))
    path = os.path.join(out_dir, "study.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write(
            "\n".join(
                ["# Over-optimisation guard study", "", *markdown(summary), f"![guard]({os.path.basename(png)})", ""]
            )
        )
    return path

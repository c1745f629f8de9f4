"""The chat demo's BoNBoN study over seeds: every method on one judge-against-KL frontier, means +- s.e.

    .venv/bin/python bench/chat_bonbon_study.py \\
        --bonbon bench/results/chat-bonbon-20261203.json --bonbon bench/results/chat-bonbon-20261204.json \\
        --ppo shipped=bench/results/chat-ppo-variants-20261204.json \\
        --ppo shipped=bench/results/chat-ppo-variants-20261204-3.json --out runs/chat_bonbon_study

Per seed it reads one ``bench/chat_bonbon.py`` result (the instruction model, the run's best-of-N sweep, its
DPO and BoNBoN at each N, all evaluated on the run's 128 held-out requests) and, per ``--ppo LABEL=FILE``
line, one ``bench/chat_ppo_variants.py`` result on the same folder and seed (PPO's checkpoints, evaluated the
same way), matched to its seed by the seed and folder it records. A PPO result must hold the same
evaluations of the instruction model and of DPO as its seed's BoNBoN result (the folder's own); one that
does not, a seed given twice and a label without a result for every seed are refused by name.

Per method and setting (the instruction model; best-of-N per N at its analytic KL; DPO per beta; BoNBoN per
N; each PPO line per checkpoint), over the seeds: the KL to the instruction model and the judge (mean +-
standard error over seeds), and the judge minus the seed's own best-of-N curve at the policy's KL (the
curve of ``bench/chat_bonbon.py``: from the instruction model at KL 0; None outside it, never
extrapolated); and each PPO line's curve minus DPO at DPO's KL (as ``chat_ppo_variants`` records it).
Writes ``frontier.png``, ``study.md`` and ``study.json`` in ``--out`` (a new folder).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the demo's package, beside rlhf_lit in a clone

from demo.seed_stats import over_seeds as seed_stats  # noqa: E402

REFERENCE = "the instruction model"
BONBON_KEYS = ("seed", "demo", "instruction_model", "best_of_n", "dpo", "bonbon")
PPO_KEYS = ("seed", "demo", "instruction_model", "dpo", "variants")


def read_result(path: Path, keys: Sequence[str], written_by: str) -> dict:
    """A bench result file with ``keys`` (exits naming the file and what is wrong)."""
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise SystemExit(f"{path}: not a readable JSON result of {written_by} ({err})") from None
    missing = [key for key in keys if not isinstance(result, dict) or key not in result]
    if missing:
        raise SystemExit(f"{path}: no {', '.join(missing)} (not a result of {written_by})")
    return result


def parse_ppo(text: str) -> tuple[str, Path]:
    """``LABEL=FILE`` as ``(label, path)``: a ``chat_ppo_variants`` result, drawn as the line ``PPO, LABEL``."""
    label, sep, path = text.partition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LABEL=FILE, e.g. shipped=bench/results/x.json")
    return label, Path(path)


def ppo_variant(result: Mapping, path: Path, label: str) -> Mapping:
    """The variant of a ``chat_ppo_variants`` result that ``label`` reads: the file's only one, or the one of
    that name. Its evaluated checkpoints (``rollouts``) and PPO's curve minus each DPO policy at that
    policy's KL (``minus_dpo``)."""
    variants = result["variants"]
    if len(variants) == 1:
        return next(iter(variants.values()))
    if label not in variants:
        raise SystemExit(f"{path}: holds the variants {sorted(variants)}; give the one to read as its label")
    return variants[label]


def same_folder(bonbon: Mapping, ppo: Mapping, paths: tuple[Path, Path]) -> None:
    """Refuse a seed's pair of files unless both are of one seed, one folder and one evaluation of the
    instruction model and of each DPO policy."""
    where = f"{paths[0]} and {paths[1]}"
    if bonbon["seed"] != ppo["seed"] or Path(bonbon["demo"]) != Path(ppo["demo"]):
        raise SystemExit(
            f"{where}: one is seed {bonbon['seed']} of {bonbon['demo']}, the other seed {ppo['seed']} of {ppo['demo']}"
        )
    pairs = [("instruction model", bonbon["instruction_model"], ppo["instruction_model"])]
    pairs += [(f"DPO {name}", bonbon["dpo"][name], ppo["dpo"].get(name)) for name in bonbon["dpo"]]
    for what, a, b in pairs:
        if b is None or (a["judge_mean"], a["kl_mean"]) != (b["judge_mean"], b["kl_mean"]):
            raise SystemExit(f"{where}: their evaluations of {what} differ (not the same folder's run)")


COST = ("samples", "rm_passes", "train_s")
"""What a policy cost to train: replies drawn, reward-model passes, the fit's seconds."""
STATS = ("kl", "judge", "minus_best_of_n", "distinct_2", "ended_fraction", *COST)
"""What a point holds beside its method and setting, each summarised over seeds (None where not measured)."""


def seed_points(bonbon: Mapping, ppo: Mapping[str, Mapping]) -> list[dict]:
    """Every policy of one seed, each with :data:`STATS`: its KL, judge, the judge minus the seed's best-of-N
    curve at its KL (:func:`chat_bonbon.margins`; None for the instruction model and best-of-N themselves,
    and outside the curve), distinct-2 and the share that end their turn (best-of-N has no distinct-2: not
    measured), and what it cost to train (:data:`COST`; BoNBoN: its pairs' share of the one draw and its fit;
    PPO: its whole fit, at its last checkpoint, from the variant's ``fit_seconds``)."""
    from chat_bonbon import margins

    run = {"base": bonbon["instruction_model"], "sweep": {"rows": bonbon["best_of_n"]}, "dpo": {}}

    def point(method: str, setting: str, metrics: Mapping, analytic: bool = False, **cost) -> dict:
        kl, judge = metrics["kl_mean"], metrics["judge_mean"]
        policy = method not in (REFERENCE, "best-of-N")
        gap = margins(run, {"kl_mean": kl, "judge_mean": judge})["best_of_n"] if policy else None
        measured = {k: metrics.get(k) for k in ("distinct_2", "ended_fraction")}
        return {"method": method, "setting": setting, "kl_analytic": analytic, "kl": kl, "judge": judge,
                "minus_best_of_n": gap, **measured, **{k: cost.get(k) for k in COST}}  # fmt: skip

    points = [point(REFERENCE, "-", bonbon["instruction_model"])]
    for row in bonbon["best_of_n"]:
        if row["n"] > 1:  # N = 1 is the instruction model's own reply
            at = {
                "kl_mean": row["kl_analytic"],
                "judge_mean": row["judge_mean"],
                "ended_fraction": row["ended_fraction"],
            }
            points.append(point("best-of-N", f"N {row['n']}", at, analytic=True))
    points += [point("DPO", f"beta {name.rsplit('_', 1)[-1]}", m) for name, m in bonbon["dpo"].items()]
    for n, entry in bonbon["bonbon"].items():
        c = entry["compute"]
        points.append(point("BoNBoN", f"N {n}", entry["metrics"], samples=c["samples"], rm_passes=c["rm_passes"],
                            train_s=c["fit_seconds"]))  # fmt: skip
    for label, variant in ppo.items():
        rollouts = sorted((int(r), m) for r, m in variant["rollouts"].items())
        points += [point(f"PPO, {label}", f"rollout {r}", m) for r, m in rollouts[:-1]]
        points.append(
            point(f"PPO, {label}", f"rollout {rollouts[-1][0]}", rollouts[-1][1], train_s=variant["fit_seconds"])
        )
    return points


def every_seed_stats(rows: Sequence[Mapping], keys: Sequence[str]) -> dict[str, dict]:
    """Mean +- s.e. over ``rows`` (:func:`demo.seed_stats.over_seeds`) of each key every row has a value of; a
    key some row lacks is left out, never averaged over fewer seeds."""
    return seed_stats(rows, [k for k in keys if all(row.get(k) is not None for row in rows)])


def over_seeds(per_seed: Sequence[Sequence[dict]]) -> list[dict]:
    """Per ``(method, setting)`` every seed has, in the first seed's order: each of :data:`STATS` as mean +-
    s.e. over the seeds (:func:`every_seed_stats`: a value some seed lacks, a policy beyond that
    seed's best-of-N curve, is left out)."""
    rows = []
    for first in per_seed[0]:
        key = (first["method"], first["setting"])
        mine = [p for points in per_seed for p in points if (p["method"], p["setting"]) == key]
        if len(mine) != len(per_seed):
            continue  # a setting some seed lacks is left out, not averaged over fewer seeds
        rows.append({"method": key[0], "setting": key[1], "kl_analytic": first["kl_analytic"], "seeds": len(mine),
                     **every_seed_stats(mine, STATS)})  # fmt: skip
    return rows


def _pm(stat: Mapping | None, digits: int = 3, sign: str = "") -> str:
    """``mean ± s.e.`` (``sign="+"``: the mean's sign always shown), ``-`` for no value."""
    if stat is None:
        return "-"
    se = "" if stat["se"] is None else f" ± {stat['se']:.{digits}f}"
    return f"{stat['mean']:{sign}.{digits}f}{se}"


def markdown(rows: Sequence[Mapping], seeds: Sequence[int], ppo_minus_dpo: Mapping[str, Mapping]) -> list[str]:
    """The study's table (one row per method and setting) and each PPO line against DPO (``ppo_minus_dpo``:
    per label, per DPO policy), means +- s.e. over ``seeds``."""
    lines = [
        f"Means ± standard errors over seeds {', '.join(map(str, seeds))}; KL to {REFERENCE} in nats per reply "
        "(analytic for best-of-N); judge (VADER) on 128 held-out requests, one reply each.",
        "",
        "| method | setting | KL | judge | − best-of-N at its KL | distinct-2 | ends its turn | replies drawn "
        "(= RM passes) | training s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        kl = _pm(row.get("kl"), 2) + (" (analytic)" if row["kl_analytic"] else "")
        lines.append(
            f"| {row['method']} | {row['setting']} | {kl} | {_pm(row.get('judge'))} "
            f"| {_pm(row.get('minus_best_of_n'), sign='+')} | {_pm(row.get('distinct_2'))} "
            f"| {_pm(row.get('ended_fraction'))} | {_pm(row.get('samples'), 0)} | {_pm(row.get('train_s'), 0)} |"
        )
    lines.append("")
    for label, margins in ppo_minus_dpo.items():
        for name, stat in margins.items():
            dpo = name.replace("dpo_beta_", "DPO beta ")
            lines.append(f"PPO, {label}, minus {dpo} at {dpo}'s KL (PPO's curve interpolated): {_pm(stat, sign='+')}.")
    return lines


def draw(rows: Sequence[Mapping], path: Path) -> str:
    """``frontier.png``: each row's mean KL and mean judge, error bars one s.e. over seeds."""
    from rlhf_lit.evaluation.frontier import FrontierPoint, draw_frontier

    points = [
        FrontierPoint(
            r["method"],
            r["setting"],
            r["kl"]["mean"],
            r["judge"]["mean"],
            r["judge"]["se"] or 0.0,
            r["seeds"],
            kl_analytic=r["kl_analytic"],
        )  # fmt: skip
        for r in rows
    ]
    return draw_frontier(
        points,
        str(path),
        title=f"Chat demo: judge against KL, mean over {rows[0]['seeds']} seeds",
        ylabel="judge (VADER), 128 held-out requests",
        xlabel=f"KL to {REFERENCE} (nats per reply)",
    )


def read_study(bonbon_paths: Sequence[Path], ppo_files: Sequence[tuple[str, Path]]) -> tuple[dict, dict]:
    """``(runs, ppo)``: each seed's ``chat_bonbon`` result (with its ``path``) and, per seed and label, the PPO
    variant read (with its ``path``); exits naming the file when a result is doubled, of another folder or
    missing for a seed."""
    runs = {}  # seed -> its chat_bonbon result
    for path in bonbon_paths:
        bonbon = read_result(path, BONBON_KEYS, "bench/chat_bonbon.py")
        if bonbon["seed"] in runs:
            raise SystemExit(f"{path}: seed {bonbon['seed']} is given twice")
        runs[bonbon["seed"]] = bonbon | {"path": path}
    ppo = {seed: {} for seed in runs}  # seed -> label -> its variant
    for label, path in ppo_files:
        result = read_result(path, PPO_KEYS, "bench/chat_ppo_variants.py")
        if result["seed"] not in runs:
            raise SystemExit(f"{path}: seed {result['seed']} has no --bonbon result (seeds {sorted(runs)})")
        run = runs[result["seed"]]
        same_folder(run, result, (run["path"], path))
        if label in ppo[result["seed"]]:
            raise SystemExit(f"{path}: a second {label!r} result of seed {result['seed']}")
        ppo[result["seed"]][label] = ppo_variant(result, path, label) | {"path": str(path)}
    labels = list(dict.fromkeys(label for label, _ in ppo_files))
    runs = dict(sorted(runs.items()))  # the seeds in order, whatever the order of the files
    for seed, mine in ppo.items():
        missing = [label for label in labels if label not in mine]
        if missing:
            raise SystemExit(f"--ppo: no {', '.join(map(repr, missing))} result of seed {seed} ({runs[seed]['demo']})")
    return runs, ppo


def main(argv: list[str] | None = None) -> int:
    """Read each seed's results, write the frontier, the table and the JSON; print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bonbon", type=Path, action="append", required=True, help="a bench/chat_bonbon.py result")
    p.add_argument("--ppo", type=parse_ppo, action="append", required=True, metavar="LABEL=FILE",
                   help="a bench/chat_ppo_variants.py result of one --bonbon run's folder and seed; "
                   "every LABEL needs one per seed")  # fmt: skip
    p.add_argument("--out", type=Path, required=True, help="a new folder for frontier.png, study.md, study.json")
    args = p.parse_args(argv)
    runs, ppo = read_study(args.bonbon, args.ppo)
    labels = list(dict.fromkeys(label for label, _ in args.ppo))
    per_seed = [seed_points(run, {label: ppo[seed][label] for label in labels}) for seed, run in runs.items()]
    rows = over_seeds(per_seed)
    dpo_names = list(next(iter(runs.values()))["dpo"])
    # per label and DPO policy: PPO's curve at that policy's KL, minus it
    ppo_minus_dpo = {
        label: every_seed_stats([v[label]["minus_dpo"] for v in ppo.values()], dpo_names) for label in labels
    }
    args.out.mkdir(parents=True, exist_ok=False)  # a new folder: never over an earlier study's
    png = draw(rows, args.out / "frontier.png")
    seeds = list(runs)
    lines = ["# The chat demo's BoNBoN study over seeds", "", *markdown(rows, seeds, ppo_minus_dpo)]
    (args.out / "study.md").write_text("\n".join([*lines, "", "![frontier](frontier.png)", ""]), encoding="utf-8")
    sources = {
        seed: {"demo": run["demo"], "bonbon": str(run["path"]), **{label: ppo[seed][label]["path"] for label in labels}}
        for seed, run in runs.items()
    }
    study = {"seeds": seeds, "sources": sources, "rows": rows, "ppo_minus_dpo": ppo_minus_dpo}
    study["per_seed"] = dict(zip(map(str, seeds), per_seed))
    (args.out / "study.json").write_text(json.dumps(study, indent=1) + "\n", encoding="utf-8")
    print("\n".join(lines[2:]))
    print(f"written: {png}, {args.out / 'study.md'}, {args.out / 'study.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The policies of ``python -m demo seeds`` against best-of-N: DPO and BoNBoN per setting, the sweep over seeds,
and what each method cost.

- :func:`best_of_n_over_seeds`: the best-of-N sweeps of the study's seeds (``best_of_n/seed_<s>``), per N the
  judge score's mean +- standard error over seeds at the analytic KL ``log N - (N-1)/N``; their mean is the
  curve every policy is compared with;
- :func:`pair_methods`: per DPO beta and BoNBoN N, each seed's final held-out evaluation, its judge score minus
  best-of-N's at the same KL (interpolated between N, never extrapolated), its distinct-2 over SFT's, and its
  cost, then the means +- standard errors over seeds;
- :func:`markdown`: their tables for ``study.md``.

Cost, per run: ``samples`` drawn and ``rm_passes`` (a best-of-N sample is read once by the reward model), the
wall seconds of drawing them (``sampling_s``) and of training (``train_s``), as ``result.json`` records them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from demo.seed_stats import interpolate, over_seeds

COMPUTE = ("samples", "rm_passes", "sampling_s", "train_s")
"""The cost fields of a run's ``compute`` summarised over seeds."""
PER_SEED = ("judge_mean", "kl_mean", "distinct_2", "distinct_2_ratio", "bon_judge_at_kl", "judge_minus_bon")


def best_of_n_over_seeds(sweeps: Sequence[Mapping]) -> dict[int, dict]:
    """Per N of the sweeps (``result.json`` of ``best_of_n`` jobs, each with ``rows`` and ``compute``): the
    analytic KL and the judge score's mean +- s.e. over seeds; only the N every sweep has."""
    by_n: dict[int, list[Mapping]] = {}
    for sweep in sweeps:
        for row in sweep["rows"]:
            if row.get("judge_mean") is not None:
                by_n.setdefault(int(row["n"]), []).append(row)
    out = {}
    for n, rows in sorted(by_n.items()):
        if len(rows) == len(sweeps):
            out[n] = {"kl": rows[0]["kl_analytic"], **over_seeds(rows, ("judge_mean",))}
    if sweeps:
        out_compute = over_seeds([s["compute"] for s in sweeps], COMPUTE)
        for n in out:
            out[n]["compute"] = out_compute
    return out


def curve(bon: Mapping[int, Mapping]) -> list[tuple[float, float]]:
    """``(KL, mean judge)`` of each N of :func:`best_of_n_over_seeds`."""
    return [(v["kl"], v["judge_mean"]["mean"]) for v in bon.values()]


def _final(result: Mapping) -> Mapping:
    return result["evaluations"]["final"]


def seed_row(result: Mapping, sft: Mapping, bon: Sequence[tuple[float, float]]) -> dict:
    """One DPO or BoNBoN seed: its held-out judge, KL, distinct-2 (and over SFT's), best-of-N's judge at its KL
    and the difference (absent outside best-of-N's KL range), and its ``compute``."""
    final = _final(result)
    row = {"seed": result["seed"], **{k: final[k] for k in ("judge_mean", "kl_mean", "distinct_2")}}
    row["distinct_2_ratio"] = final["distinct_2"] / sft["distinct_2"]
    at = interpolate(bon, final["kl_mean"]) if bon else None
    if at is not None:
        row["bon_judge_at_kl"] = at
        row["judge_minus_bon"] = final["judge_mean"] - at
    row.update({k: v for k, v in result.get("compute", {}).items() if k in COMPUTE})
    return row


def pair_methods(results: Sequence[Mapping], sft: Mapping, bon: Sequence[tuple[float, float]]) -> dict[str, dict]:
    """``{"dpo": {name: ...}, "bonbon": {name: ...}}``: per setting its seeds' rows (:func:`seed_row`) and their
    means +- s.e. (``mean``)."""
    out: dict[str, dict] = {"dpo": {}, "bonbon": {}}
    for r in results:
        if r["method"] in out:
            entry = out[r["method"]].setdefault(r["name"], {"overrides": r["overrides"], "seeds": []})
            entry["seeds"].append(seed_row(r, sft, bon))
    for settings in out.values():
        for entry in settings.values():
            entry["seeds"].sort(key=lambda row: row["seed"])
            entry["mean"] = over_seeds(entry["seeds"], (*PER_SEED, *COMPUTE))
    return out


def _pm(stat: Mapping | None, digits: int = 3) -> str:
    if stat is None:
        return "-"
    se = "" if stat["se"] is None else f" +- {stat['se']:.{digits}f}"
    return f"{stat['mean']:.{digits}f}{se}"


def _count(stat: Mapping | None) -> str:
    return "-" if stat is None else f"{stat['mean']:,.0f}"


def markdown(methods: Mapping[str, Mapping], bon: Mapping[int, Mapping]) -> list[str]:
    """The tables of the pair methods and the best-of-N sweep for ``study.md``."""
    lines: list[str] = []
    if bon:
        lines += [
            "## Best-of-N over seeds",
            "",
            "| N | KL (analytic) | judge | samples per prompt |",
            "|---|---|---|---|",
        ]
        lines += [f"| {n} | {v['kl']:.2f} | {_pm(v.get('judge_mean'))} | {n} |" for n, v in bon.items()]
        compute = next(iter(bon.values())).get("compute", {})
        lines += [
            "",
            f"One sweep per seed: {_count(compute.get('samples'))} samples drawn and read by the reward model, "
            f"{_pm(compute.get('sampling_s'), 0)} s wall.",
            "",
        ]
    for method, title in (("bonbon", "BoNBoN"), ("dpo", "DPO against best-of-N")):
        if not methods.get(method):
            continue
        lines += [
            f"## {title}",
            "",
            "| setting | judge | KL | judge - best-of-N at that KL | distinct-2 / SFT's | samples | RM passes "
            "| sampling s | training s |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for name, entry in methods[method].items():
            m = entry["mean"]
            lines.append(
                f"| {name} | {_pm(m.get('judge_mean'))} | {_pm(m.get('kl_mean'), 2)} | {_pm(m.get('judge_minus_bon'))} "
                f"| {_pm(m.get('distinct_2_ratio'))} | {_count(m.get('samples'))} | {_count(m.get('rm_passes'))} "
                f"| {_pm(m.get('sampling_s'), 0)} | {_pm(m.get('train_s'), 0)} |"
            )
        lines.append("")
    return lines

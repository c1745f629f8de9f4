"""Read back and tabulate :mod:`recipe_smollm2`'s runs: the TensorBoard scalars of each stage, the
metrics named as logged, mean ± s.e. across seeds, and the markdown tables of ``--tables``."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import yaml

STAGES = {"rm": ("reward_model.yaml", "reward_model"), "dpo": ("dpo.yaml", "dpo"), "ppo": ("ppo.yaml", "ppo")}
"""``--stages`` name -> (config file in configs/smollm2_hh/, the stage's directory in the run dir)."""
PPO_KEYS = ("objective/scores", "objective/kl", "response/ended_fraction", "response/length")
"""The PPO metrics aggregated per rollout across seeds (every logged tag is kept per seed)."""


def read_events(stage_dir: Path) -> dict[str, list[tuple[int, float, float]]]:
    """Every scalar tag of the newest ``version_N`` under ``stage_dir``: ``[(step, value, wall_time)]``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    versions = sorted(stage_dir.glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
    if not versions:
        raise FileNotFoundError(f"no version_* under {stage_dir}")
    acc = EventAccumulator(str(versions[-1]), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def resolved_model_args(stage_dir: Path) -> dict | None:
    """``model.init_args`` of the run's resolved config (``version_N/config.yaml``): the defaults the
    code had at run time included (e.g. PPO's ``ppo.remove_padding``)."""
    configs = sorted(stage_dir.glob("version_*/config.yaml"), key=lambda p: int(p.parent.name.split("_")[1]))
    return yaml.safe_load(configs[-1].read_text())["model"]["init_args"] if configs else None


def step_times(events: list[tuple[int, float, float]]) -> dict:
    """Seconds between consecutive logged steps (the first step, with setup, has no predecessor)."""
    walls = [w for _, _, w in sorted(events)]
    diffs = [b - a for a, b in zip(walls, walls[1:])]
    return {
        "per_step_s": diffs,
        "mean_s": statistics.fmean(diffs) if diffs else None,
        "median_s": statistics.median(diffs) if diffs else None,
    }


def summarize(stage: str, events: dict) -> dict:
    """The metrics of one run, named as logged: the last value of every ``val/*`` tag, every
    ``train/*`` tag per step, step times; for PPO every tag per rollout and the rollout times."""
    out: dict = {"tags": sorted(events)}
    if stage in ("rm", "dpo"):
        out["val"] = {t: ev[-1][1] for t, ev in events.items() if t.startswith("val/")}
        out["val_step"] = {t: ev[-1][0] for t, ev in events.items() if t.startswith("val/")}
        out["train"] = {t: [v for _, v, _ in ev] for t, ev in events.items() if t.startswith("train/")}
        out["step_time"] = step_times(events["train/loss"])
        last_train = max(w for _, _, w in events["train/loss"])
        first_val = min((ev[-1][2] for t, ev in events.items() if t.startswith("val/")), default=None)
        out["train_end_to_val_logged_s"] = None if first_val is None else first_val - last_train
    else:
        out["per_rollout"] = {t: [v for _, v, _ in sorted(ev)] for t, ev in events.items()}
        phases = [t for t in events if t.startswith("time/") and t.endswith("_s") and t != "time/tokens_per_s"]
        totals = [sum(vals) for vals in zip(*(out["per_rollout"][t] for t in phases))]
        out["rollout_time"] = {
            "phases": phases,
            "per_rollout_s": totals,
            "mean_s": statistics.fmean(totals) if totals else None,
            "wall_between_rollouts": step_times(events["objective/scores"]),
        }
    return out


def mean_se(values: list[float]) -> dict:
    """Mean, sample std (ddof 1), s.e. = std / sqrt(n), n (std and s.e. None below two values)."""
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return {"mean": None, "std": None, "se": None, "n": 0, "values": values}
    std = statistics.stdev(vals) if len(vals) > 1 else None
    return {
        "mean": statistics.fmean(vals),
        "std": std,
        "se": None if std is None else std / math.sqrt(len(vals)),
        "n": len(vals),
        "values": values,
    }


def aggregate(runs: dict) -> dict:
    """Mean ± s.e. across seeds of every stage's headline numbers."""
    out: dict = {}
    by_stage = lambda stage: [r[stage] for r in runs.values() if stage in r and "metrics" in r[stage]]  # noqa: E731
    for stage in ("rm", "dpo"):
        seeds = by_stage(stage)
        if seeds:
            tags = sorted(set().union(*(s["metrics"]["val"] for s in seeds)))
            cfg = yaml.safe_load(Path(f"configs/smollm2_hh/{STAGES[stage][0]}").read_text())
            pairs = min(cfg["trainer"]["limit_val_batches"] * cfg["data"]["init_args"]["batch_size"], 60)
            out[stage] = {
                "val": {t: mean_se([s["metrics"]["val"].get(t) for s in seeds]) for t in tags},
                "val_pairs": pairs,
                "binomial_se_at_chance": math.sqrt(0.25 / pairs),
                "step_s": mean_se([s["metrics"]["step_time"]["mean_s"] for s in seeds]),
                "wall_s": mean_se([s["run"]["wall_s"] for s in seeds if "run" in s]),
                "peak_rss_mib": mean_se([s["run"]["peak_rss_mib"] for s in seeds if "run" in s]),
            }
    seeds = by_stage("ppo")
    if seeds:
        ppo: dict = {"per_rollout": {}, "last_minus_first": {}}
        for key in PPO_KEYS + ("objective/rlhf_reward", "objective/entropy"):
            series = [s["metrics"]["per_rollout"].get(key, []) for s in seeds]
            n = min(map(len, series))
            ppo["per_rollout"][key] = [mean_se([x[i] for x in series]) for i in range(n)]
            ppo["last_minus_first"][key] = mean_se([x[n - 1] - x[0] for x in series]) if n > 1 else None
        ppo["rollout_s"] = mean_se([s["metrics"]["rollout_time"]["mean_s"] for s in seeds])
        ppo["wall_s"] = mean_se([s["run"]["wall_s"] for s in seeds if "run" in s])
        ppo["peak_rss_mib"] = mean_se([s["run"]["peak_rss_mib"] for s in seeds if "run" in s])
        out["ppo"] = ppo
    return out


def fmt(stat: dict | None, digits: int = 3) -> str:
    """``mean ± s.e.`` of a :func:`mean_se` dict (``mean`` alone for one value)."""
    if not stat or stat["mean"] is None:
        return "n/a"
    return f"{stat['mean']:.{digits}f}" + ("" if stat["se"] is None else f" ± {stat['se']:.{digits}f}")


def tables(result: dict) -> str:
    """Markdown tables of a result JSON (for docs/recipe-results.md)."""
    runs, agg, lines = result["runs"], result["aggregate"], []
    seeds = sorted(runs, key=lambda s: int(s[4:]))
    for stage, tag_list in (
        ("rm", ["val/accuracy", "val/loss", "val/margin"]),
        ("dpo", ["val/reward_accuracy", "val/loss", "val/reward_margin", "val/implicit_kl"]),
    ):
        if stage not in agg:
            continue
        lines += [
            f"\n{stage.upper()} (held-out, last validation)\n",
            "| tag | " + " | ".join(seeds) + " | mean ± s.e. |",
            "| --- |" + " --- |" * (len(seeds) + 1),
        ]
        for tag in tag_list:
            vals = [runs[s].get(stage, {}).get("metrics", {}).get("val", {}).get(tag) for s in seeds]
            cells = ["n/a" if v is None else f"{v:.3f}" for v in vals]
            lines.append(f"| `{tag}` | " + " | ".join(cells) + f" | {fmt(agg[stage]['val'].get(tag))} |")
    if "ppo" in agg:
        ppo = agg["ppo"]
        n = len(ppo["per_rollout"]["objective/scores"])
        lines += [
            "\nPPO per rollout, mean ± s.e. across seeds\n",
            "| tag | " + " | ".join(f"rollout {i}" for i in range(n)) + " | last - first |",
            "| --- |" + " --- |" * (n + 1),
        ]
        for key, stats in ppo["per_rollout"].items():
            lines.append(
                f"| `{key}` | " + " | ".join(fmt(s) for s in stats) + f" | {fmt(ppo['last_minus_first'][key])} |"
            )
    held = result.get("held_out_eval")
    if held:
        lines += [
            f"\nHeld-out prompts ({held['prompts']}), each seed's RM, mean ± s.e. across seeds\n",
            "| metric | original | PPO | PPO - original |",
            "| --- | --- | --- | --- |",
        ]
        for k in ("rm_mean", "kl_mean", "length_mean", "ended_fraction"):
            diff = held["ppo_minus_original"].get(k)
            lines.append(
                f"| `{k}` | {fmt(held['original'][k])} | {fmt(held['ppo'][k])} | {fmt(diff) if diff else '-'} |"
            )
        lines.append(
            f"\nsame response as the original (fraction of prompts): {fmt(held.get('same_response_fraction'))}"
        )
    lines += [
        "\nCost (mean ± s.e. across seeds)\n",
        "| stage | s per step / rollout | wall s | peak RSS MiB |",
        "| --- | --- | --- | --- |",
    ]
    for stage, step in (("rm", "step_s"), ("dpo", "step_s"), ("ppo", "rollout_s")):
        if stage in agg:
            a = agg[stage]
            lines.append(f"| {stage} | {fmt(a[step], 1)} | {fmt(a['wall_s'], 0)} | {fmt(a['peak_rss_mib'], 0)} |")
    return "\n".join(lines)

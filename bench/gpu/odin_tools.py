"""Helpers of bench/gpu/odin_study.sh (the ODIN length-bias study): configs, prompts, events, summary.

    python bench/gpu/odin_tools.py configs --scale gpu|tiny --model DIR --out DIR
    python bench/gpu/odin_tools.py prompts --config DIR/ppo.yaml --model DIR --out FILE.jsonl
    python bench/gpu/odin_tools.py events --run STAGE_DIR --out FILE.json
    python bench/gpu/odin_tools.py summary --work DIR --out FILE.txt

``configs`` writes ``rm.yaml`` and ``ppo.yaml``: configs/smollm2_hh/reward_model.yaml and ppo.yaml with
the study's settings (below), no checkpoint callback (a 135M model's checkpoint with Adam states is
~2 GB: writing one per run would cost more than the run), no progress bar. ``prompts`` writes the
held-out prompts of ppo.yaml's data (the records the RM fits held out, as PPO reads them: decoded
from the ids with the chat template applied, for ``rlhf-lit evaluate --chat-template never``).
``events`` reads every scalar of the newest ``version_N`` of a stage directory (TensorBoard).
``summary`` reads the work folder the study filled and prints the tables of summary.txt.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import yaml

SCALES = {
    # GPU: 1 x H100, all 2312 HH harmless-base records, 20% held out.
    "gpu": {
        "trainer": {"accelerator": "gpu", "precision": "bf16-mixed"},
        "rm_trainer": {
            "max_steps": -1,
            "max_epochs": 1,
            "val_check_interval": 1.0,
            "limit_val_batches": 1.0,
            "log_every_n_steps": 5,
        },
        "data": {"max_records": None, "val_fraction": 0.2, "seed": 0},
        "rm_data": {"max_length": 512, "max_prompt_length": 384, "batch_size": 16},
        "rm_lr": 1.0e-5,
        "ppo_data": {"max_prompt_length": 384, "batch_size": 32},
        "ppo": {"max_rollouts": 40, "max_new_tokens": 128, "epochs": 2, "minibatch_size": 8},
    },
    # CPU smoke run of the whole script (minutes on 2 cores): tiny budgets, same code paths.
    "tiny": {
        "trainer": {"accelerator": "cpu", "precision": "32-true"},
        "rm_trainer": {
            "max_steps": 2,
            "max_epochs": 1,
            "val_check_interval": 2,
            "limit_val_batches": 1.0,
            "log_every_n_steps": 1,
        },
        "data": {"max_records": 16, "val_fraction": 0.2, "seed": 0},
        "rm_data": {"max_length": 256, "max_prompt_length": 192, "batch_size": 4},
        "rm_lr": 1.0e-5,
        "ppo_data": {"max_prompt_length": 192, "batch_size": 4},
        "ppo": {"max_rollouts": 2, "max_new_tokens": 8, "epochs": 1, "minibatch_size": 4},
    },
}
"""What each scale changes in the recipe configs (everything else as configs/smollm2_hh/ ships it)."""

QUIET = {"enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False, "callbacks": []}


def write_configs(
    scale: str, model: str, out: Path, ppo_lr: float | None, ppo_epochs: int | None, ppo_minibatch: int | None
) -> None:
    """``<out>/rm.yaml`` and ``<out>/ppo.yaml`` for ``scale`` (:data:`SCALES`)."""
    s = SCALES[scale]
    rm = yaml.safe_load(Path("configs/smollm2_hh/reward_model.yaml").read_text())
    rm.pop("run_dir", None)  # given per run on the command line
    for key in ("max_steps", "max_epochs", "val_check_interval", "limit_val_batches"):
        rm["trainer"].pop(key, None)
    rm["trainer"].update({**s["trainer"], **s["rm_trainer"], **QUIET})
    rm["model"]["init_args"]["model"] = model
    rm["model"]["init_args"]["optimizer"]["lr"] = s["rm_lr"]
    rm["data"]["init_args"].update({**s["data"], **s["rm_data"]})
    ppo = yaml.safe_load(Path("configs/smollm2_hh/ppo.yaml").read_text())
    ppo.pop("run_dir", None)
    ppo["trainer"].update({**s["trainer"], **QUIET, "max_epochs": -1})
    args = ppo["model"]["init_args"]
    args["sft_model"] = model
    args["max_rollouts"] = s["ppo"]["max_rollouts"]
    args["sampling"]["max_new_tokens"] = s["ppo"]["max_new_tokens"]
    args["ppo"]["epochs"] = ppo_epochs or s["ppo"]["epochs"]
    args["ppo"]["minibatch_size"] = ppo_minibatch or s["ppo"]["minibatch_size"]
    if ppo_lr is not None:
        args["optimizer"]["lr"] = ppo_lr
    ppo["data"]["init_args"].update({**s["data"], **s["ppo_data"]})
    out.mkdir(parents=True, exist_ok=True)
    header = f"# written by bench/gpu/odin_tools.py configs --scale {scale} (from configs/smollm2_hh/)\n"
    (out / "rm.yaml").write_text(header + yaml.safe_dump(rm, sort_keys=False))
    (out / "ppo.yaml").write_text(header + yaml.safe_dump(ppo, sort_keys=False))


def write_prompts(config: Path, model: str, out: Path) -> None:
    """The held-out prompts of ``config``'s PromptDataModule, decoded (chat template already applied)."""
    from rlhf_lit.data import PromptDataModule
    from rlhf_lit.data.encoding import TextEncoder
    from rlhf_lit.tokenizer import load_tokenizer

    init = yaml.safe_load(config.read_text())["data"]["init_args"]
    tokenizer = load_tokenizer(model, padding_side="left")
    data = PromptDataModule(tokenizer=tokenizer, **init)
    data.setup("fit")
    encoder = TextEncoder(tokenizer, apply_chat_template=False)
    rows, same = [], 0
    for item in data.val_dataset:
        text = tokenizer.decode(item["input_ids"], skip_special_tokens=False)
        same += encoder.encode_prompts([text])[0] == list(item["input_ids"])
        rows.append({"prompt": text, "val_index": int(item["index"])})
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} held-out prompts -> {out}; {same} re-encode to the same ids", file=sys.stderr)


def read_events(stage_dir: Path) -> dict:
    """Every scalar tag of the newest ``version_N`` under ``stage_dir``: ``{tag: [[step, value, wall_time]]}``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    versions = sorted(stage_dir.glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
    if not versions:
        raise FileNotFoundError(f"no version_* under {stage_dir}")
    acc = EventAccumulator(str(versions[-1]), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [[e.step, e.value, e.wall_time] for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


PPO_SERIES = {
    "response_length": "response/length",
    "score": "objective/scores",
    "kl": "objective/kl",
    "ended_fraction": "response/ended_fraction",
    "rlhf_reward": "objective/rlhf_reward",
}
"""Per-rollout series pulled out of a PPO run's events (names as rlhf_lit/stages/ppo/metrics.py logs them)."""


def write_events(run: Path, out: Path) -> None:
    """All scalars of ``run`` and, for PPO, :data:`PPO_SERIES` per rollout."""
    scalars = read_events(run)
    result: dict = {"run": str(run), "scalars": scalars}
    if "response/length" in scalars:
        result["per_rollout"] = {
            name: [[int(s), float(v)] for s, v, _ in scalars.get(tag, [])] for name, tag in PPO_SERIES.items()
        }
    out.write_text(json.dumps(result, indent=1) + "\n")


# ------------------------------------------------------------------------------------------- summary
RM_TRAIN_TAGS = (
    "train/accuracy",
    "train/quality_length_correlation",
    "train/length_head_correlation",
    "train/head_orthogonality",
)
"""The training tags of an RM fit shown beside its val/* (the last three only with length_debias odin)."""


def _fmt(v, digits: int = 3) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def _mean_se(xs: list[float]) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "n/a"
    if len(xs) == 1:
        return f"{xs[0]:.3f}"
    return f"{statistics.fmean(xs):.3f} ± {statistics.stdev(xs) / math.sqrt(len(xs)):.3f} (n={len(xs)})"


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def summary(work: Path) -> str:
    """The tables of summary.txt from what the study left in ``work``."""
    lines: list[str] = []
    add = lines.append
    timings = work / "timings.tsv"
    add("== phases (seconds, exit status)")
    add(timings.read_text().rstrip() if timings.exists() else "(none)")
    versions = work / "versions.txt"
    if versions.exists():
        add("\n== environment")
        add(versions.read_text().rstrip())

    bench = _load(work / "results" / "rm_length_bias.json")
    add("\n== reward models on the held-out pairs (bench/rm_length_bias.py)")
    if bench:
        add(f"config: {json.dumps(bench['config'])}")
        add(
            f"{'rm':<14}{'n':>5}{'acc':>8}{'r(s,len)':>10}{'r(dm,dlen)':>11}{'RM>long':>9}{'hum>long':>9}"
            f"{'acc|long':>9}{'acc|short':>10}{'len':>7}"
        )
        for name, r in bench["reward_models"].items():
            add(
                f"{name:<14}{r['n_pairs']:>5}{_fmt(r['accuracy']):>8}{_fmt(r['pearson_score_length']):>10}"
                f"{_fmt(r['pearson_margin_length_diff']):>11}{_fmt(r['rm_prefers_longer']):>9}"
                f"{_fmt(r['human_prefers_longer']):>9}{_fmt(r['accuracy_longer_chosen']):>9}"
                f"{_fmt(r['accuracy_shorter_chosen']):>10}{_fmt(r['length_mean'], 1):>7}"
            )
        for variant in ("plain", "odin"):
            rows = [r for n, r in bench["reward_models"].items() if n.startswith(variant + "_")]
            if rows:
                add(
                    f"{variant}: accuracy {_mean_se([r['accuracy'] for r in rows])}; r(score, length) "
                    f"{_mean_se([r['pearson_score_length'] for r in rows])}; RM prefers longer "
                    f"{_mean_se([r['rm_prefers_longer'] for r in rows])}"
                )
    else:
        add("(no results)")

    add("\n== reward-model fits: last logged val/* and the length terms of train/* (TensorBoard)")
    for path in sorted((work / "results").glob("events_rm_*.json")):
        ev = _load(path) or {}
        vals = {
            tag: series[-1][1]
            for tag, series in ev.get("scalars", {}).items()
            if series and (tag.startswith("val/") or tag in RM_TRAIN_TAGS)
        }
        add(f"{path.stem[len('events_') :]:<14}" + "  ".join(f"{k} {v:.4f}" for k, v in sorted(vals.items())))

    add("\n== PPO per rollout (TensorBoard): first -> last, and mean of the last 5")
    for path in sorted((work / "results").glob("events_ppo_*.json")):
        ev = _load(path) or {}
        per = ev.get("per_rollout", {})
        parts = []
        for name in ("response_length", "score", "kl", "ended_fraction"):
            series = [v for _, v in per.get(name, [])]
            if series:
                tail = statistics.fmean(series[-5:])
                parts.append(f"{name} {series[0]:.3f} -> {series[-1]:.3f} (last5 {tail:.3f})")
        n = len(per.get("response_length", []))
        add(f"{path.stem[len('events_') :]:<10} rollouts {n}: " + "; ".join(parts))

    add("\n== held-out evaluation (rlhf-lit evaluate): policy x judging RM")
    add(f"{'policy':<11}{'rm':<7}{'rm_mean':>9}{'rm_std':>8}{'length':>8}{'ended':>7}{'kl':>8}{'dist2':>7}{'n':>5}")
    evals = {}
    for path in sorted((work / "results").glob("eval_*.json")):
        ev = _load(path)
        if not ev:
            continue
        policy, rm = path.stem[len("eval_") :].split("__rm_")
        evals[(policy, rm)] = ev
        m = ev.get("metrics", {})
        add(
            f"{policy:<11}{rm:<7}{_fmt(m.get('rm_mean')):>9}{_fmt(m.get('rm_std')):>8}{_fmt(m.get('length_mean'), 1):>8}"
            f"{_fmt(m.get('ended_fraction'), 2):>7}{_fmt(m.get('kl_mean')):>8}{_fmt(m.get('distinct_2'), 2):>7}"
            f"{m.get('num_samples', 'n/a'):>5}"
        )
    for policy in sorted({p for p, _ in evals}):
        pair = [evals.get((policy, rm)) for rm in ("plain", "odin")]
        if all(pair):
            a, b = (e.get("samples", []) for e in pair)
            same = statistics.fmean(x["response"] == y["response"] for x, y in zip(a, b)) if a and b else None
            add(f"{policy}: the two RMs' evaluations sampled the same response on {_fmt(same, 3)} of the prompts")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("configs")
    c.add_argument("--scale", choices=sorted(SCALES), required=True)
    c.add_argument("--model", required=True)
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--ppo-lr", type=float, default=None)
    c.add_argument("--ppo-epochs", type=int, default=None)
    c.add_argument("--ppo-minibatch", type=int, default=None)
    pr = sub.add_parser("prompts")
    pr.add_argument("--config", type=Path, required=True)
    pr.add_argument("--model", required=True)
    pr.add_argument("--out", type=Path, required=True)
    e = sub.add_parser("events")
    e.add_argument("--run", type=Path, required=True)
    e.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("summary")
    s.add_argument("--work", type=Path, required=True)
    s.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.command == "configs":
        write_configs(args.scale, args.model, args.out, args.ppo_lr, args.ppo_epochs, args.ppo_minibatch)
    elif args.command == "prompts":
        write_prompts(args.config, args.model, args.out)
    elif args.command == "events":
        write_events(args.run, args.out)
    else:
        text = summary(args.work)
        args.out.write_text(text)
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

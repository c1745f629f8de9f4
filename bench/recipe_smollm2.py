"""Measure the offline recipe configs/smollm2_hh/: RM, DPO and PPO over several seeds.

Each stage runs as shipped through the real CLI, in a subprocess under ``/usr/bin/time -v``::

    rlhf-lit fit --config configs/smollm2_hh/<stage>.yaml --run_dir <root>/seed<S> --seed_everything <S>

Only ``seed_everything`` changes between seeds; the data split keeps the configs' ``seed: 0`` (and
``max_records: 600``, ``val_fraction: 0.1``), so every seed holds out the same 60 records. PPO of
seed S reads the RM of seed S (both share the run directory). After the runs the TensorBoard events
are read back (EventAccumulator) and one JSON is written, ``bench/results/recipe-smollm2-<UTC date>.json``:
the git commit (and whether the tree was dirty) per stage, the machine, torch, per seed and stage the
wall time, peak RSS and step times, the logged metrics (named as the code logs them), and mean
± s.e. across seeds (s.e. = sample std (ddof 1) / sqrt(n seeds)). After PPO of the first seed,
``rlhf-lit evaluate`` samples the original model, the PPO export (and the DPO export, when there)
on the first ``--eval-prompts`` held-out prompts with one fixed seed and temperature; the samples go
into the JSON. ``--heldout-seeds`` compares the original model and each seed's PPO export on all 60
held-out prompts, scored by that seed's RM. A later invocation on the same day merges into the same JSON.

Run from the checkout, one torch thread, the model linked at models/SmolLM2-135M-Instruct::

    OMP_NUM_THREADS=1 .venv/bin/python bench/recipe_smollm2.py --stages rm,dpo,ppo --seeds 1,2,3
    OMP_NUM_THREADS=1 .venv/bin/python bench/recipe_smollm2.py --stages ppo --collect-only --no-eval --heldout-seeds 1,2,3
    OMP_NUM_THREADS=1 .venv/bin/python bench/recipe_smollm2.py --collect-only --reuse-evals   # re-read, no new runs
    .venv/bin/python bench/recipe_smollm2.py --tables bench/results/recipe-smollm2-<date>.json     # markdown

``--wait-for FILE`` (used for PPO only) polls for FILE every 30 s for at most ``--wait-minutes``
before the PPO runs, then goes on either way; the JSON records what happened.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml
from recipe_smollm2_report import STAGES, aggregate, mean_se, read_events, resolved_model_args, summarize, tables

MODEL = "models/SmolLM2-135M-Instruct"
CLI = str(Path(sys.executable).with_name("rlhf-lit"))
LOG_FILE = os.environ.get("RECIPE_MEASURE_LOG", "/tmp/recipe_measure.log")


def log(message: str) -> None:
    """Print ``message`` with a UTC timestamp and append it to :data:`LOG_FILE`."""
    line = f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M:%S}Z {message}"
    print(line, flush=True)
    with open(LOG_FILE, "a") as f:
        f.write(line + "\n")


def sh(*cmd: str) -> str:
    """stdout of ``cmd`` (stripped)."""
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()


def git_state() -> dict:
    """HEAD, whether the tree is dirty, the changed paths and a hash of ``git diff HEAD`` (which
    tells two dirty states apart)."""
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    changed = status.stdout.splitlines()  # "XY path": not stripped
    diff = subprocess.run(["git", "diff", "HEAD"], capture_output=True, check=True).stdout
    return {
        "commit": sh("git", "rev-parse", "HEAD"),
        "dirty": bool(changed),
        "changed": [c[3:] for c in changed],
        "diff_sha256": hashlib.sha256(diff).hexdigest()[:16],
    }


def machine() -> dict:
    """CPU model, AVX-512, core count, torch version and the torch thread setting."""
    import torch

    lscpu = sh("lscpu")
    field = lambda name: next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith(name)), None)  # noqa: E731
    return {
        "cpu": field("Model name"),
        "avx512": "avx512f" in (field("Flags") or ""),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
    }


def parse_time_v(text: str) -> dict:
    """Peak RSS (MiB), wall, user and system seconds from ``/usr/bin/time -v`` output."""

    def value(label: str) -> str:
        match = re.search(rf"^\s*{re.escape(label)}.*?:\s*(\S+)\s*$", text, flags=re.MULTILINE)
        return match.group(1) if match else "nan"

    wall = 0.0
    for part in value("Elapsed (wall clock) time").split(":"):  # h:mm:ss or m:ss.ss
        wall = wall * 60 + float(part)
    return {
        "wall_s": wall,
        "peak_rss_mib": float(value("Maximum resident set size")) / 1024,
        "user_s": float(value("User time")),
        "system_s": float(value("System time")),
    }


def run_stage(stage: str, seed: int, root: Path) -> dict:
    """Run one stage of one seed through ``rlhf-lit fit`` under ``/usr/bin/time -v``; its console
    output goes to ``<root>/seed<S>/<stage>.log``."""
    config, _ = STAGES[stage]
    run_dir = root / f"seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    time_file = run_dir / f"{stage}.time"
    cmd = [
        "/usr/bin/time",
        "-v",
        "-o",
        str(time_file),
        CLI,
        "fit",
        "--config",
        f"configs/smollm2_hh/{config}",
        "--run_dir",
        str(run_dir),
        "--seed_everything",
        str(seed),
    ]
    log(f"start {stage} seed {seed}: {' '.join(cmd[4:])}")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(run_dir / f"{stage}.log", "w") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    result = {"command": " ".join(cmd[4:]), "returncode": rc, **parse_time_v(time_file.read_text())}
    log(f"end {stage} seed {seed}: rc {rc}, wall {result['wall_s']:.0f} s, peak RSS {result['peak_rss_mib']:.0f} MiB")
    return result


def held_out_prompts(n: int, path: Path) -> list[dict]:
    """The first ``n`` held-out prompts of ppo.yaml's data (its PromptDataModule, set up as the CLI
    sets it up), as PPO would read them: decoded from the ids, written as JSONL strings already in the
    chat template (evaluate them with ``--chat-template never``). Each re-encodes to the same ids."""
    from rlhf_lit.data import PromptDataModule
    from rlhf_lit.data.encoding import TextEncoder
    from rlhf_lit.tokenizer import load_tokenizer

    init = yaml.safe_load(Path("configs/smollm2_hh/ppo.yaml").read_text())["data"]["init_args"]
    tokenizer = load_tokenizer(MODEL, padding_side="left")
    data = PromptDataModule(tokenizer=tokenizer, **init)
    data.setup("fit")
    encoder = TextEncoder(tokenizer, apply_chat_template=False)
    rows = []
    for item in data.val_dataset[:n]:
        text = tokenizer.decode(item["input_ids"], skip_special_tokens=False)
        rows.append(
            {
                "prompt": text,
                "val_index": item["index"],
                "same_ids": encoder.encode_prompts([text])[0] == list(item["input_ids"]),
            }
        )
    path.write_text("".join(json.dumps({"prompt": r["prompt"]}) + "\n" for r in rows))
    log(
        f"{len(rows)} held-out prompts of {len(data.val_dataset)} -> {path}; re-encode to the same ids: "
        f"{all(r['same_ids'] for r in rows)}"
    )
    return rows


def evaluate(policy: str, prompts: Path, out: Path, rm: str, reference: str | None, args) -> dict:
    """``rlhf-lit evaluate`` of ``policy`` on ``prompts`` (fixed seed and temperature); its JSON."""
    cmd = [
        CLI,
        "evaluate",
        "--policy",
        policy,
        "--prompts",
        str(prompts),
        "--chat-template",
        "never",
        "--reward-model",
        rm,
        "--temperature",
        str(args.eval_temperature),
        "--max-new-tokens",
        "48",
        "--seed",
        "0",
        "--out",
        str(out),
        "--overwrite",
    ]
    if reference:
        cmd += ["--reference", reference]
    wanted = {
        "policy": policy,
        "reward_model": rm,
        "reference": reference,
        "seed": 0,
        "prompts": str(prompts),
        "sampling": {"temperature": args.eval_temperature, "max_new_tokens": 48},
    }
    earlier = json.loads(out.read_text()).get("config", {}) if args.reuse_evals and out.exists() else {}
    same = (
        earlier
        and all(earlier.get(k) == v for k, v in wanted.items() if k != "sampling")
        and all(earlier.get("sampling", {}).get(k) == v for k, v in wanted["sampling"].items())
    )
    t0, reused = time.time(), bool(same)
    if reused:
        log(f"evaluate: reusing {out} (same policy, RM, reference, prompts and sampling)")
    else:
        log(f"evaluate: {' '.join(cmd[1:])}")
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if proc.returncode != 0:
            log(f"evaluate failed (rc {proc.returncode}): {proc.stderr[-2000:]}")
            return {"command": " ".join(cmd[1:]), "returncode": proc.returncode, "stderr_tail": proc.stderr[-2000:]}
    result = json.loads(out.read_text())
    return {
        "command": " ".join(cmd[1:]),
        "returncode": 0,
        "reused_output": reused,
        "wall_s": None if reused else time.time() - t0,
        "timing_s": result.get("timing_s"),
        "metrics": result.get("metrics"),
        "samples": result.get("samples"),
    }


def same_responses(a: dict, b: dict) -> float | None:
    """Fraction of prompts on which two evaluations (same prompts, same sampling seed) sampled the
    very same response text."""
    if not a.get("samples") or not b.get("samples"):
        return None
    return statistics.fmean(x["response"] == y["response"] for x, y in zip(a["samples"], b["samples"]))


def samples_before_after(root: Path, seed: int, args) -> dict:
    """Held-out prompts sampled from the original model, the PPO export and (when there) the DPO
    export of ``seed``, scored by that seed's RM."""
    run_dir = root / f"seed{seed}"
    prompts_file = root / "held_out_prompts.jsonl"
    prompts = held_out_prompts(args.eval_prompts, prompts_file)
    rm = str(run_dir / "reward_model" / "model")
    policies = {"original": (MODEL, None), "ppo": (str(run_dir / "ppo" / "model"), MODEL)}
    if (run_dir / "dpo" / "model").is_dir():
        policies["dpo"] = (str(run_dir / "dpo" / "model"), MODEL)
    evals = {
        name: evaluate(policy, prompts_file, root / f"eval_{name}_seed{seed}.json", rm, ref, args)
        for name, (policy, ref) in policies.items()
    }
    same = {name: same_responses(evals["original"], e) for name, e in evals.items() if name != "original"}
    return {
        "seed": seed,
        "prompts": prompts,
        "same_response_as_original": same,
        "temperature": args.eval_temperature,
        "max_new_tokens": 48,
        "sampling_seed": 0,
        "reward_model": rm,
        "evaluations": evals,
    }


def held_out_eval(root: Path, seeds: list[int], args) -> dict:
    """For every seed: the original model and the PPO export on the first ``--heldout-prompts``
    held-out prompts, scored by that seed's RM (metrics only, no samples); mean ± s.e. across seeds
    of each policy's metrics and of PPO minus original (the same prompts and sampling seed)."""
    n = args.heldout_prompts
    prompts_file = root / f"held_out_prompts_{n}.jsonl"
    held_out_prompts(n, prompts_file)
    per_seed: dict = {}
    for seed in seeds:
        run_dir = root / f"seed{seed}"
        rm = str(run_dir / "reward_model" / "model")
        evals = {
            "original": evaluate(MODEL, prompts_file, root / f"heldout{n}_original_seed{seed}.json", rm, None, args),
            "ppo": evaluate(
                str(run_dir / "ppo" / "model"), prompts_file, root / f"heldout{n}_ppo_seed{seed}.json", rm, MODEL, args
            ),
        }
        fields = ("command", "returncode", "reused_output", "wall_s", "timing_s", "metrics")
        per_seed[f"seed{seed}"] = {k: {f: e.get(f) for f in fields} for k, e in evals.items()}
        per_seed[f"seed{seed}"]["same_response_fraction"] = same_responses(evals["original"], evals["ppo"])
    ok = [r for r in per_seed.values() if r["original"]["returncode"] == 0 and r["ppo"]["returncode"] == 0]
    metric = lambda r, policy, key: (r[policy]["metrics"] or {}).get(key)  # noqa: E731
    keys = ("rm_mean", "kl_mean", "length_mean", "ended_fraction")
    out = {
        "prompts": n,
        "temperature": args.eval_temperature,
        "max_new_tokens": 48,
        "sampling_seed": 0,
        "per_seed": per_seed,
    }
    for policy in ("original", "ppo"):
        out[policy] = {k: mean_se([metric(r, policy, k) for r in ok]) for k in keys}
    out["ppo_minus_original"] = {
        k: mean_se(
            [
                metric(r, "ppo", k) - metric(r, "original", k)
                for r in ok
                if metric(r, "ppo", k) is not None and metric(r, "original", k) is not None
            ]
        )
        for k in ("rm_mean", "length_mean", "ended_fraction")
    }
    out["same_response_fraction"] = mean_se([r["same_response_fraction"] for r in ok])
    return out


def wait_for(flag: str, minutes: float) -> dict:
    """Poll for ``flag`` every 30 s for at most ``minutes``; what happened."""
    t0 = time.time()
    log(f"waiting for {flag} (at most {minutes:g} min)")
    while not os.path.exists(flag) and time.time() - t0 < minutes * 60:
        time.sleep(30)
    found = os.path.exists(flag)
    waited = time.time() - t0
    log(f"{flag} {'found' if found else 'NOT found; going on anyway'} after {waited:.0f} s")
    return {"file": flag, "found": found, "waited_s": waited}


def main() -> int:
    """Parse the options, run and collect the stages, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stages", default="rm,dpo,ppo", help="comma-separated, of rm, dpo, ppo (run in that order)")
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated seed_everything values")
    parser.add_argument("--root", default="runs/recipe_measure", help="run directories <root>/seed<S>")
    parser.add_argument("--out", default=None, help="result JSON (default bench/results/recipe-smollm2-<date>.json)")
    parser.add_argument("--collect-only", action="store_true", help="do not run; re-read the events of earlier runs")
    parser.add_argument("--wait-for", default=None, help="before PPO, wait for this file (e.g. /tmp/ppo_code_ready)")
    parser.add_argument("--wait-minutes", type=float, default=40.0)
    parser.add_argument("--eval-prompts", type=int, default=8, help="held-out prompts for the before/after samples")
    parser.add_argument("--eval-temperature", type=float, default=0.7, help="as ppo.yaml's sampling")
    parser.add_argument("--no-eval", action="store_true", help="skip the before/after samples")
    parser.add_argument(
        "--heldout-seeds", default=None, help="after PPO: original vs PPO of these seeds on held-out prompts"
    )
    parser.add_argument("--heldout-prompts", type=int, default=60, help="held-out prompts for --heldout-seeds")
    parser.add_argument(
        "--reuse-evals", action="store_true", help="read an evaluate JSON of the same settings, if there"
    )
    parser.add_argument("--tables", metavar="JSON", default=None, help="print markdown tables of a result JSON, exit")
    args = parser.parse_args()
    if args.tables:
        print(tables(json.loads(Path(args.tables).read_text())))
        return 0
    stages = [s for s in STAGES if s in args.stages.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    root = Path(args.root)
    out = Path(args.out or f"bench/results/recipe-smollm2-{dt.datetime.now(dt.timezone.utc):%Y%m%d}.json")
    result = json.loads(out.read_text()) if out.exists() else {"issue": 37, "recipe": "configs/smollm2_hh", "runs": {}}
    result.update(machine=machine(), root=str(root), model=MODEL, cli=CLI)
    result.setdefault("stage_git", {})

    def save() -> None:
        try:
            result["aggregate"] = aggregate(result["runs"])
        except Exception as error:  # keep the raw per-seed results and the remaining runs
            result["aggregate_error"] = repr(error)
            log(f"aggregate failed: {error!r}")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")

    for stage in stages:
        if stage == "ppo" and args.wait_for and not args.collect_only:
            result["ppo_wait"] = wait_for(args.wait_for, args.wait_minutes)
        if not args.collect_only or stage not in result["stage_git"]:
            result["stage_git"][stage] = git_state()
            log(f"{stage}: git {result['stage_git'][stage]}")
        for seed in seeds:
            entry = result["runs"].setdefault(f"seed{seed}", {}).setdefault(stage, {})
            if not args.collect_only:
                for stale in ("metrics", "metrics_error", "resolved_model_args"):
                    entry.pop(stale, None)
                entry["git"] = git_state()  # per run: the tree may change between seeds
                entry["run"] = run_stage(stage, seed, root)
                if entry["run"]["returncode"] != 0:
                    log(f"{stage} seed {seed} FAILED: see {root}/seed{seed}/{stage}.log")
                    save()
                    continue
            try:
                stage_dir = root / f"seed{seed}" / STAGES[stage][1]
                entry["metrics"] = summarize(stage, read_events(stage_dir))
                entry["resolved_model_args"] = resolved_model_args(stage_dir)
            except (FileNotFoundError, KeyError) as error:
                entry["metrics_error"] = repr(error)
                log(f"{stage} seed {seed}: no metrics ({error!r})")
            save()
        if stage == "ppo" and not args.no_eval and (root / f"seed{seeds[0]}" / "ppo" / "model").is_dir():
            result["samples"] = samples_before_after(root, seeds[0], args)
            save()
        if stage == "ppo" and args.heldout_seeds:
            result["held_out_eval"] = held_out_eval(root, [int(s) for s in args.heldout_seeds.split(",")], args)
            save()
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

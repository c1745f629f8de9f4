"""A short smoke run of bench/ppo_throughput.py the way peer-bench's ``run_all.sh --extra`` calls it
(the workload in ``PEERBENCH_*`` variables, the results as JSON); no timing is asserted.

The compiled options (``--decode compiled --forward compiled``) are followed from the command line
to the module's settings and from the module's compile counts to the report, without a compiled run:
a run would spend two minutes of the suite lowering graphs that tests/ppo/test_gen_train_diff.py's
``[compiled]`` cases already compile, and check, in the PPO iteration this script times."""

from __future__ import annotations

import importlib.util
import json
import os

import cli_forked
import pytest
import torch
from assets_paths import ROOT, STORIES260K
from lightning.pytorch import Trainer

from rlhf_lit.models import compiled_generation
from rlhf_lit.models.compiled_generation import CompileStats
from rlhf_lit.tokenizer import load_tokenizer

STORIES = STORIES260K


SCRIPT = ROOT / "bench" / "ppo_throughput.py"


def _smoke_workload(tmp_path) -> dict[str, str]:
    """The ``PEERBENCH_*`` variables of a 2-iteration workload of 4 prompts on stories260K."""
    tokenizer = load_tokenizer(str(STORIES), padding_side="left")
    rows, masks = [], []
    for text in ["Once upon a time", "The little dog ran", "Tom", "She saw a big red"]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:6]
        rows.append([tokenizer.pad_token_id] * (6 - len(ids)) + ids)
        masks.append([0] * (6 - len(ids)) + [1] * len(ids))
    prompt_file = tmp_path / "prompt_ids.json"
    prompt_file.write_text(json.dumps({"input_ids": rows, "attention_mask": masks}))
    workload = dict(
        POLICY=STORIES,
        REWARD=STORIES,
        TOKENIZER=STORIES,
        BATCH=4,
        PROMPT_LEN=6,
        RESP_LEN=5,
        EPOCHS=1,
        MINIBATCHES=2,
        ITERS=2,
        THREADS=1,
        TEMPERATURE=0.7,
        KL_COEF=0.05,
        SEED=0,
        LR=1e-5,
        WORKLOAD="smoke",
        PROMPT_IDS=prompt_file,
        JSON=tmp_path / "out.json",
    )
    return {f"PEERBENCH_{k}": str(v) for k, v in workload.items()}


@pytest.mark.parametrize("old_logprobs", ["rescore", "sampling"])
def test_benchmark_runs_a_workload_from_the_harness_environment(tmp_path, old_logprobs):
    workload_env = _smoke_workload(tmp_path)
    options = [] if old_logprobs == "rescore" else ["--old-logprobs", "sampling"]  # rescore is the default
    # a process forked from this one (tests/cli_forked.py): no imports to pay
    result = cli_forked.run_script(SCRIPT, *options, cwd=tmp_path, env=workload_env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["workload"] == "smoke" and out["iters"] == 2 and len(out["iters_s"]) == 2
    assert out["old_logprobs"] == old_logprobs and f"old logprobs: {old_logprobs}" in result.stdout
    assert out["decode"] == "eager" and "decode: eager," in result.stdout  # the defaults: nothing compiled
    assert out["forward"] == "eager" and "forward: eager," in result.stdout
    assert out["remove_padding"] == "off" and "remove padding: off," in result.stdout  # the default: padded rows
    assert out["reuse_first_forward"] == "on" and "reuse first forward: on)" in result.stdout  # the default
    assert out["forward_compile_graphs"] == out["compile_graphs"] == 0
    assert "compiled passes:" not in result.stdout and "compiled decode:" not in result.stdout
    for key in ("iter_median_s", "gen_s", "rollout_s", "train_s", "tokens_per_s", "peak_rss_mib"):
        assert out[key] > 0, key
    # Full-length responses (ignore_eos): 4 prompts x 5 tokens per iteration.
    assert abs(out["tokens_per_s"] * out["iter_median_s"] - 20) < 1e-6
    assert "iteration" in result.stdout and not (tmp_path / "model").exists()  # the export went to a temp dir


def _bench_module(monkeypatch):
    """bench/ppo_throughput.py imported in this process (its import sets two variables: undone after the test)."""
    for name in ("HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM"):  # set, then removed: monkeypatch records the
        monkeypatch.setenv(name, os.environ.get(name, ""))  # original (or its absence) and restores it
        monkeypatch.delenv(name)
    spec = importlib.util.spec_from_file_location("bench_ppo_throughput", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_compiled_options_reach_the_module_and_its_compile_counts_the_report(tmp_path, monkeypatch, capsys):
    bench = _bench_module(monkeypatch)
    for name, value in _smoke_workload(tmp_path).items():
        monkeypatch.setenv(name, value)
    options = ["--old-logprobs", "sampling", "--decode", "compiled", "--forward", "compiled"]

    # The command line to run(): a stand-in run returns compile counts no real run of this workload has.
    runs = []

    def counted_run(w, iters, accelerator, precision, out_dir, *settings):
        runs.append(settings)
        rows = [{f"time/{p}_s": 0.1 for p in ("generate", "score", "train", "text")}] * iters
        return {
            "iter_s": [0.5] * iters,
            "cpu_s": [0.5] * iters,
            "metrics": rows,
            "forward_stats": CompileStats(graphs=3, compile_calls_s=3.0, calls=5),
        }

    real_run = bench.run
    monkeypatch.setattr(bench, "run", counted_run)
    monkeypatch.setattr(
        compiled_generation, "compile_stats", lambda: CompileStats(graphs=7, compile_calls_s=2.0, calls=9)
    )
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # main() sets the workload's: not this process's
    assert bench.main(options) == 0
    assert runs == [("sampling", "compiled", "compiled", False, True)]
    out = json.loads((tmp_path / "out.json").read_text())
    assert (out["old_logprobs"], out["decode"], out["forward"]) == ("sampling", "compiled", "compiled")
    assert out["forward_compile_graphs"] == 3 and out["forward_compile_calls_s"] == 3.0
    assert out["compile_graphs"] == 7 and out["compile_calls_s"] == 2.0
    stdout = capsys.readouterr().out
    assert "old logprobs: sampling, decode: compiled, forward: compiled," in stdout
    assert "compiled decode: 7 graph(s) compiled in calls of 2.0 s in all" in stdout
    assert "compiled passes: 3 graph(s) compiled in calls of 3.0 s in all (5 calls)" in stdout

    # run() to the module it builds and back: the settings, and the module's own compile counts returned
    # (the fit is not started: compiling is what it would cost).
    built = []

    def recording_build(w, iters, **settings):
        built.append((settings, build_module(w, iters, **settings)))
        return built[-1][1]

    build_module = bench.build_module
    monkeypatch.setattr(bench, "build_module", recording_build)
    monkeypatch.setattr(Trainer, "fit", lambda *args, **kwargs: None)
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)  # run() seeds Lightning: undone after the test
    result = real_run(
        bench.workload_from_env(), 1, "cpu", "32-true", str(tmp_path), "sampling", "compiled", "compiled", False, True
    )
    ((settings, module),) = built
    assert settings | {"export_dir": None} == dict(
        export_dir=None,
        old_logprobs="sampling",
        decode="compiled",
        forward="compiled",
        remove_padding=False,
        reuse_first_forward=True,
    )
    assert (module.sampling.decode, module.ppo.forward, module.ppo.old_logprobs) == ("compiled", "compiled", "sampling")
    assert result["forward_stats"] is module.forward_passes.stats

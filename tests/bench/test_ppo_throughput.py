"""A short smoke run of bench/ppo_throughput.py the way peer-bench's ``run_all.sh --extra`` calls it
(the workload in ``PEERBENCH_*`` variables, the results as JSON); no timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys

import cli_forked
import pytest
from assets_paths import ROOT, STORIES260K
from suite_env import subprocess_env

from rlhf_lit.tokenizer import load_tokenizer

STORIES = STORIES260K


@pytest.mark.parametrize("old_logprobs,decode,forward", [
    ("rescore", "eager", "eager"), ("sampling", "eager", "eager"),
    pytest.param("sampling", "compiled", "compiled", marks=pytest.mark.slow),  # compiles (2 layers: two_layer_stories)
])  # fmt: skip
def test_benchmark_runs_a_workload_from_the_harness_environment(tmp_path, request, old_logprobs, decode, forward):
    tokenizer = load_tokenizer(str(STORIES), padding_side="left")
    model = STORIES if decode == forward == "eager" else request.getfixturevalue("two_layer_stories")  # cheaper to compile
    rows, masks = [], []
    for text in ["Once upon a time", "The little dog ran", "Tom", "She saw a big red"]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:6]
        rows.append([tokenizer.pad_token_id] * (6 - len(ids)) + ids)
        masks.append([0] * (6 - len(ids)) + [1] * len(ids))
    prompt_file = tmp_path / "prompt_ids.json"
    prompt_file.write_text(json.dumps({"input_ids": rows, "attention_mask": masks}))
    workload = dict(POLICY=model, REWARD=model, TOKENIZER=model, BATCH=4, PROMPT_LEN=6, RESP_LEN=5, EPOCHS=1,
                    MINIBATCHES=2, ITERS=2, THREADS=1, TEMPERATURE=0.7, KL_COEF=0.05, SEED=0, LR=1e-5,
                    WORKLOAD="smoke", PROMPT_IDS=prompt_file, JSON=tmp_path / "out.json")  # fmt: skip
    workload_env = {f"PEERBENCH_{k}": str(v) for k, v in workload.items()}
    options = [] if old_logprobs == "rescore" else ["--old-logprobs", "sampling"]  # rescore is the default
    options += [] if decode == "eager" else ["--decode", decode]  # eager is the default
    options += [] if forward == "eager" else ["--forward", forward]
    script = ROOT / "bench" / "ppo_throughput.py"
    if decode == forward == "eager":  # a process forked from this one (tests/cli_forked.py): no imports to pay
        result = cli_forked.run_script(script, *options, cwd=tmp_path, env=workload_env, timeout=300)
    else:  # a new interpreter: what it compiles, and counts, is its own
        result = subprocess.run([sys.executable, str(script), *options], env=subprocess_env(workload_env), cwd=tmp_path,
                                capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["workload"] == "smoke" and out["iters"] == 2 and len(out["iters_s"]) == 2
    assert out["old_logprobs"] == old_logprobs and f"old logprobs: {old_logprobs}" in result.stdout
    assert out["decode"] == decode and f"decode: {decode}," in result.stdout  # which generation path ran
    assert out["forward"] == forward and f"forward: {forward}," in result.stdout  # which passes ran
    assert out["remove_padding"] == "off" and "remove padding: off," in result.stdout  # the default: padded rows
    assert out["reuse_first_forward"] == "on" and "reuse first forward: on)" in result.stdout  # the default
    # sampling: the critic-only pass scores (no grad); the update: policy and critic (grad)
    assert out["forward_compile_graphs"] == (2 if forward == "compiled" else 0)
    assert ("compiled passes: 2 graph(s)" in result.stdout) == (forward == "compiled")
    assert (out["compile_graphs"] == 1) == (decode == "compiled")  # one batch size, one cache bucket
    assert ("compiled decode: 1 graph(s)" in result.stdout) == (decode == "compiled")
    for key in ("iter_median_s", "gen_s", "rollout_s", "train_s", "tokens_per_s", "peak_rss_mib"):
        assert out[key] > 0, key
    # Full-length responses (ignore_eos): 4 prompts x 5 tokens per iteration.
    assert abs(out["tokens_per_s"] * out["iter_median_s"] - 20) < 1e-6
    assert "iteration" in result.stdout and not (tmp_path / "model").exists()  # the export went to a temp dir

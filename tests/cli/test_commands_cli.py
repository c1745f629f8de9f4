"""`rlhf-lit evaluate` and `rlhf-lit best-of-n` as a user runs them, on the tiny offline models."""

from __future__ import annotations

import json
import math

from assets_paths import STORIES260K_CHAT
from cli_helpers import STORIES, error_line, run_main

JUDGE = "rlhf_lit.evaluation.judges:vader"
METRICS = [
    "judge_mean",
    "judge_std",
    "rm_mean",
    "rm_std",
    "kl_mean",
    "kl_std",
    "distinct_1",
    "distinct_2",
    "distinct_2_within",
    "distinct_2_across",
    "length_mean",
    "ended_fraction",
    "other_turn_fraction",
    "num_samples",
]


def test_evaluate_writes_json_and_prints_the_table(tmp_path, stories_rm):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"text": "Once upon a time"}\n{"text": "Tom had a big red"}\n\n{"text": "The cat"}\n')
    out = tmp_path / "eval.json"
    args = [
        "evaluate",
        "--policy",
        str(STORIES),
        "--reference",
        str(STORIES),
        "--reward-model",
        stories_rm,
        "--judge",
        JUDGE,
        "--prompts",
        str(prompts),
        "--prompt-field",
        "text",
        "--samples-per-prompt",
        "2",
        "--max-new-tokens",
        "8",
        "--batch-size",
        "4",
        "--seed",
        "3",
        "--out",
        str(out),
    ]
    result = run_main(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "kl_mean" in result.stdout and "rm_mean" in result.stdout  # the table
    data = json.loads(out.read_text())
    assert data["written_by"] == "rlhf-lit evaluate"
    assert list(data["metrics"]) == METRICS
    m = data["metrics"]
    assert m["num_samples"] == 6
    assert m["kl_mean"] == 0.0 and m["kl_std"] == 0.0  # the policy is its own reference
    samples = data["samples"]
    assert [s["prompt_index"] for s in samples] == [0, 0, 1, 1, 2, 2]
    assert [s["prompt"] for s in samples[::2]] == ["Once upon a time", "Tom had a big red", "The cat"]
    assert all(math.isfinite(s["rm"]) and -1 <= s["judge"] <= 1 and 1 <= s["length"] <= 8 for s in samples)
    assert m["rm_mean"] == sum(s["rm"] for s in samples) / 6
    assert data["config"]["sampling"]["max_new_tokens"] == 8 and data["config"]["num_prompts"] == 3

    replaced = run_main(*args, "--overwrite", cwd=tmp_path)  # its own earlier output; same seed: same samples
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    assert json.loads(out.read_text())["samples"] == samples


def test_evaluate_several_policies_on_one_prompt_file(tmp_path):
    # Two policies, one prompt file, one seed: a directory of one result per policy (each what a
    # one-policy run writes, so frontier reads it), one table row per policy, nothing written over.
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Once upon a time\nThe dog ran\n")
    common = [
        "--reference",
        str(STORIES),
        "--judge",
        JUDGE,
        "--prompts",
        str(prompts),
        "--chat-template",
        "never",
        "--samples-per-prompt",
        "2",
        "--max-new-tokens",
        "6",
        "--seed",
        "4",
    ]
    several = ["evaluate", "--policy", str(STORIES), str(STORIES260K_CHAT), *common, "--out", "evals"]
    result = run_main(*several, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    files = {name: tmp_path / "evals" / f"{name}.json" for name in ("stories260K", "stories260K-chat")}
    assert sorted(p.name for p in (tmp_path / "evals").iterdir()) == sorted(p.name for p in files.values())
    table = result.stdout.splitlines()
    assert table[0].split()[:2] == ["policy", "judge_mean"] and "kl_mean" in table[0]
    assert [line.split()[0] for line in table[2:4]] == [str(STORIES), str(STORIES260K_CHAT)]
    data = {name: json.loads(path.read_text()) for name, path in files.items()}
    assert data["stories260K-chat"]["config"]["policy"] == str(STORIES260K_CHAT)
    assert all(d["written_by"] == "rlhf-lit evaluate" and d["config"]["seed"] == 4 for d in data.values())

    # The second policy sampled as it does alone: the same seed for each, not one stream across them.
    alone = run_main("evaluate", "--policy", str(STORIES260K_CHAT), *common, "--out", "alone.json", cwd=tmp_path)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert "policy" not in alone.stdout.splitlines()[0]  # one policy: the one-policy table
    assert json.loads((tmp_path / "alone.json").read_text())["samples"] == data["stories260K-chat"]["samples"]

    frontier = run_main("frontier", "--eval", *(f"M:{name}={path}" for name, path in files.items()), cwd=tmp_path)
    assert frontier.returncode == 0, frontier.stderr[-3000:]
    assert "stories260K-chat" in frontier.stdout

    again = run_main(*several, cwd=tmp_path)
    assert again.returncode == 2
    assert error_line(again).endswith("exists; pass --overwrite to replace it, or choose another file")
    replaced = run_main(*several, "--overwrite", cwd=tmp_path)
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    assert json.loads(files["stories260K"].read_text())["samples"] == data["stories260K"]["samples"]
    into_file = run_main(
        "evaluate", "--policy", str(STORIES), str(STORIES260K_CHAT), *common, "--out", "alone.json", cwd=tmp_path
    )
    assert into_file.returncode == 2
    assert "--out alone.json is a file; with several --policy it names a directory" in error_line(into_file)
    twice = run_main("evaluate", "--policy", str(STORIES), str(STORIES), *common, cwd=tmp_path)
    assert twice.returncode == 2 and error_line(twice).endswith("--policy: the same directory is given twice")


def test_best_of_n_sweep_json(tmp_path, stories_rm):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Once upon a time\nThe dog ran\n")
    out = tmp_path / "bon" / "best.json"
    result = run_main(
        "best-of-n",
        "--policy",
        str(STORIES),
        "--reward-model",
        stories_rm,
        "--judge",
        JUDGE,
        "--prompts",
        str(prompts),
        "--n-max",
        "4",
        "--max-new-tokens",
        "6",
        "--seed",
        "1",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "KL(analytic)" in result.stdout
    data = json.loads(out.read_text())
    assert data["written_by"] == "rlhf-lit best-of-n"
    assert data["config"]["ns"] == [1, 2, 4] and data["config"]["num_samples"] == 4
    rows = data["rows"]
    assert [r["n"] for r in rows] == [1, 2, 4]
    assert set(rows[0]) == {
        "n",
        "kl_analytic",
        "judge_mean",
        "judge_stderr",
        "rm_mean",
        "rm_stderr",
        "length_mean",
        "ended_fraction",
    }
    assert [r["kl_analytic"] for r in rows] == [0.0, math.log(2) - 0.5, math.log(4) - 0.75]
    samples = data["samples"]
    assert len(samples) == 8 and [s["sample_index"] for s in samples[:4]] == [0, 1, 2, 3]
    # Checked from the samples: N = 1 averages all of them; N = M takes the RM argmax of each prompt.
    assert rows[0]["rm_mean"] == sum(s["rm"] for s in samples) / 8
    assert rows[0]["judge_mean"] == sum(s["judge"] for s in samples) / 8
    best = [max(samples[4 * p : 4 * p + 4], key=lambda s: s["rm"]) for p in (0, 1)]
    assert rows[2]["rm_mean"] == sum(s["rm"] for s in best) / 2
    assert rows[2]["judge_mean"] == sum(s["judge"] for s in best) / 2
    assert rows[0]["rm_mean"] <= rows[1]["rm_mean"] <= rows[2]["rm_mean"]


def test_bad_input_is_one_line_before_sampling(tmp_path, stories_rm):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Once"}\n{"prompt": "The"\n')
    result = run_main(
        "best-of-n", "--policy", str(STORIES), "--reward-model", stories_rm, "--prompts", str(prompts), cwd=tmp_path
    )
    assert result.returncode == 1
    assert "prompts.jsonl line 2: not valid JSON (Expecting ',' delimiter at column 17)" in error_line(result)


def test_unfinished_with_eos_changes_only_the_rm_scores_of_cut_responses(tmp_path, stories_rm):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Once upon a time\nThe dog ran\nTom had a big red\n")
    runs = {}
    for how in ("as_sampled", "with_eos"):
        out = tmp_path / f"{how}.json"
        result = run_main(
            "evaluate",
            "--policy",
            str(STORIES),
            "--reward-model",
            stories_rm,
            "--prompts",
            str(prompts),
            "--samples-per-prompt",
            "4",
            "--max-new-tokens",
            "6",
            "--seed",
            "2",
            "--unfinished",
            how,
            "--out",
            str(out),
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        runs[how] = json.loads(out.read_text())
        assert runs[how]["config"]["unfinished"] == how
    pairs = list(zip(runs["as_sampled"]["samples"], runs["with_eos"]["samples"]))
    assert all(a["response"] == b["response"] and a["ended"] == b["ended"] for a, b in pairs)  # the same samples
    cut = [(a, b) for a, b in pairs if not a["ended"]]
    assert cut  # 6 tokens: most stories are cut
    assert all(a["rm"] != b["rm"] for a, b in cut)  # read at an appended EOS
    assert all(a["rm"] == b["rm"] for a, b in pairs if a["ended"])  # an ended response already ends at EOS


def test_evaluate_measures_the_kl_of_a_trained_policy_to_its_reference(tmp_path, offline_chain):
    # The exports of the session's `rlhf-lit fit` chain (tests/offline_chain.py): the PPO policy
    # against the SFT model it started from, scored by the chain's reward model.
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Once upon a time\nThe dog ran\n")
    policy, reference, rm = (str(offline_chain.export(stage)) for stage in ("ppo", "sft", "reward_model"))
    runs = {}
    for name, against in (("ppo", reference), ("self", policy)):
        out = tmp_path / f"{name}.json"
        result = run_main(
            "evaluate",
            "--policy",
            policy,
            "--reference",
            against,
            "--reward-model",
            rm,
            "--prompts",
            str(prompts),
            "--samples-per-prompt",
            "2",
            "--max-new-tokens",
            "8",
            "--seed",
            "3",
            "--out",
            str(out),
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = json.loads(out.read_text())
    assert runs["ppo"]["metrics"]["num_samples"] == 4
    assert runs["ppo"]["samples"] == [
        {**s, "kl": a["kl"]} for s, a in zip(runs["self"]["samples"], runs["ppo"]["samples"])
    ]
    assert runs["self"]["metrics"]["kl_mean"] == 0.0  # against itself
    assert any(s["kl"] != 0.0 for s in runs["ppo"]["samples"])  # against the SFT model PPO moved away from
    assert all(math.isfinite(s["rm"]) for s in runs["ppo"]["samples"])


def test_evaluate_samples_as_the_ppo_policy_did_in_training_unless_told(tmp_path, offline_chain):
    # The chain's PPO (configs/offline/ppo.yaml with tests/offline_chain.py's options) sampled 8 new tokens at
    # temperature 1.0, no top-k / top-p; evaluate's own default is 48 tokens.
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Once upon a time\n")
    policy = offline_chain.export("ppo")
    marker = json.loads((policy / "rlhf_lit_export.json").read_text())
    assert marker["sampling"] == {
        "max_new_tokens": 8,
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
        "draw": "multinomial",
    }
    runs = {}
    told = ["--max-new-tokens", "5", "--temperature", "0.7", "--draw", "inverse_cdf"]
    for name, flags in (("recorded", []), ("told", told)):
        out = tmp_path / f"{name}.json"
        result = run_main(
            "evaluate", "--policy", str(policy), "--prompts", str(prompts), "--out", str(out), *flags, cwd=tmp_path
        )
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = (json.loads(out.read_text())["config"]["sampling"], result.stderr)
    sampling, said = runs["recorded"]
    assert [sampling[k] for k in ("max_new_tokens", "temperature", "top_k", "top_p", "draw")] == [
        8,
        1.0,
        0,
        1.0,
        "multinomial",
    ]
    assert "sampling as the policy did in training (its rlhf_lit_export.json): max_new_tokens 8, temperature" in said
    sampling, said = runs["told"]
    assert (sampling["max_new_tokens"], sampling["temperature"], sampling["top_k"], sampling["draw"]) == (
        5,
        0.7,
        0,
        "inverse_cdf",
    )
    assert "sampling as the policy did" in said and "max_new_tokens 8" not in said  # top_k, top_p still taken


def test_policies_that_sampled_differently_in_training_need_the_option_given(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Once upon a time\n")
    policies = []
    for name, temperature in (("a", 0.7), ("b", 1.0)):
        folder = tmp_path / name
        folder.mkdir()
        for item in STORIES.iterdir():
            (folder / item.name).write_bytes(item.read_bytes())
        sampling = {"max_new_tokens": 16, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        (folder / "rlhf_lit_export.json").write_text(json.dumps({"what": "PPO policy", "sampling": sampling}))
        policies.append(str(folder))
    result = run_main("evaluate", "--policy", *policies, "--prompts", str(prompts), cwd=tmp_path)
    assert error_line(result) == (
        f"rlhf-lit: error: --temperature: the policies sampled with different values in training "
        f"(0.7 ({policies[0]}), 1.0 ({policies[1]})); give it on the command line"
    )
    (tmp_path / "b" / "rlhf_lit_export.json").write_text('{"what": "PPO pol')
    result = run_main(
        "evaluate", "--policy", policies[1], "--prompts", str(prompts), "--temperature", "1", cwd=tmp_path
    )
    assert error_line(result).startswith(f"rlhf-lit: error: --policy {policies[1]}: ")
    assert "rlhf_lit_export.json: cut short" in error_line(result)

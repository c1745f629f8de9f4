"""``rlhf-lit iterate`` with ``policy: bonbon``: online best-of-N distillation with a moving anchor.

Iteration t draws K samples per fresh prompt from the current policy, ranks them by the labeller and fits
BoNBoN on each prompt's best and worst of K, starting from (and anchored at) the policy that drew them. The
loop's decisions are checked with a stand-in for ``rlhf-lit fit`` (:class:`BoNBoNFits`); one test runs the real
stage in this process, three steps an iteration.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from assets_paths import CONFIGS, STORIES260K, STORIES260K_CHAT, TINYSTORIES
from iterate_helpers import error_line, in_process_fits, iterate, jsonl, tiny_loop
from iterate_judges import length_judge

from rlhf_lit.artifacts import EXPORT_MARKER


class BoNBoNFits:
    """A stand-in for ``rlhf-lit fit``: records each command line and copies ``policy`` to the stage's export."""

    def __init__(self, policy: Path = STORIES260K) -> None:
        self.policy, self.calls = policy, []

    def __call__(self, args: list[str], log_path: str) -> int:
        options = dict(zip(args[1::2], args[2::2]))
        export = Path(options["--run_dir"]) / "bonbon" / "model"
        self.calls.append(options)
        shutil.copytree(self.policy, export)
        (export / EXPORT_MARKER).write_text("{}", encoding="utf-8")
        Path(log_path).write_text("fake fit\n", encoding="utf-8")
        return 0


def bonbon_loop(tmp_path: Path, **groups) -> Path:
    """A tiny ``policy: bonbon`` loop config in ``tmp_path`` (:func:`iterate_helpers.tiny_loop`), groups overridden."""
    bonbon = {"policy": "bonbon", "bonbon": {"config": str(CONFIGS / "offline/iterate/bonbon.yaml")}}
    return tiny_loop(tmp_path, bonbon, **groups)


def test_each_iteration_distils_the_best_and_worst_of_the_current_policy_s_samples(tmp_path, monkeypatch):
    fits = BoNBoNFits()
    result = iterate(bonbon_loop(tmp_path), fits, monkeypatch, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "run"
    for t in (1, 2):
        samples = {s["prompt"]: s["responses"] for s in jsonl(run / f"iter_{t}" / "samples.jsonl")}
        pairs = jsonl(run / f"iter_{t}" / "bonbon_pairs.jsonl")
        assert pairs, f"iteration {t} wrote no pair"
        for pair in pairs:
            drawn = samples[pair["prompt"]]
            scores = length_judge(drawn)  # by hand: the judge re-applied to every sample of the prompt
            assert pair["chosen"] == drawn[scores.index(max(scores))]  # the first drawn among equals
            assert pair["rejected"] == drawn[scores.index(min(scores))]
            assert (pair["chosen_score"], pair["rejected_score"]) == (max(scores), min(scores))
            assert pair["n"] == 3 and max(scores) > min(scores)
        # every prompt whose samples do not all tie gives one pair
        assert len(pairs) == sum(len(set(length_judge(r))) > 1 for r in samples.values())
    first, second = fits.calls
    # The moving anchor: iteration 1 starts from the SFT model, iteration 2 from iteration 1's export.
    assert first["--model.init_args.model"] == str(STORIES260K)
    assert second["--model.init_args.model"] == str(run / "iter_1" / "bonbon" / "model")
    for t, options in ((1, first), (2, second)):
        assert options["--model.init_args.n"] == "3"
        assert options["--data.init_args.train_path"] == str(run / f"iter_{t}" / "bonbon_pairs.jsonl")
        assert options["--data.init_args.chat_template"] == "never"
    # No reward model is refitted; the summary names the last BoNBoN export as the final policy.
    assert not (run / "iter_1" / "reward_model").exists()
    rows = json.loads((run / "summary.json").read_text(encoding="utf-8"))["rows"]
    assert [row["iteration"] for row in rows] == [0, 1, 2]
    assert all(row["rm_acc_after"] is None and row["gold"] is not None for row in rows[1:])
    assert str(run / "iter_2" / "bonbon" / "model") in result.stdout


def test_a_rerun_skips_what_is_done(tmp_path, monkeypatch):
    config = bonbon_loop(tmp_path, iterations=1)
    assert iterate(config, BoNBoNFits(), monkeypatch, tmp_path).returncode == 0
    pairs = (tmp_path / "run" / "iter_1" / "bonbon_pairs.jsonl").read_text(encoding="utf-8")
    fits = BoNBoNFits()
    again = iterate(bonbon_loop(tmp_path, iterations=2), fits, monkeypatch, tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [c["--run_dir"] for c in fits.calls] == [str(tmp_path / "run" / "iter_2")]
    assert (tmp_path / "run" / "iter_1" / "bonbon_pairs.jsonl").read_text(encoding="utf-8") == pairs


def test_labels_whose_scores_miss_a_sample_are_refused_before_the_pairs(tmp_path, monkeypatch):
    # The pairs are drawn from labels.json's scores of every sample: one missing would pair the wrong replies.
    assert iterate(bonbon_loop(tmp_path, iterations=1), BoNBoNFits(), monkeypatch, tmp_path).returncode == 0
    run = tmp_path / "run" / "iter_1"
    (run / "bonbon_pairs.jsonl").unlink()  # drawn again from the labels on the rerun
    labels = json.loads((run / "labels.json").read_text(encoding="utf-8"))
    labels["sample_scores"][1] = labels["sample_scores"][1][:2]
    (run / "labels.json").write_text(json.dumps(labels), encoding="utf-8")
    fits = BoNBoNFits()
    result = iterate(bonbon_loop(tmp_path, iterations=1), fits, monkeypatch, tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    line = error_line(result)
    assert f"{run / 'labels.json'}: field 'sample_scores[1]' holds 2 scores for the 3 samples of prompt 1" in line
    assert fits.calls == [] and not (run / "bonbon_pairs.jsonl").exists()


def test_a_chat_policy_s_pairs_keep_the_conversation_it_read(tmp_path, monkeypatch):
    fits = BoNBoNFits(STORIES260K_CHAT)
    config = bonbon_loop(tmp_path, iterations=1, sft_model=str(STORIES260K_CHAT))
    assert iterate(config, fits, monkeypatch, tmp_path).returncode == 0
    (options,) = fits.calls
    assert options["--data.init_args.chat_template"] == "always"
    for pair in jsonl(tmp_path / "run" / "iter_1" / "bonbon_pairs.jsonl"):
        (turn,) = pair["prompt"]
        assert turn["role"] == "user" and isinstance(turn["content"], str)
        for side in ("chosen", "rejected"):
            (answer,) = pair[side]
            assert answer["role"] == "assistant"


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ({"bonbon": {"config": ""}}, "bonbon.config is required"),
        ({"ppo": {"config": str(CONFIGS / "offline/iterate/ppo.yaml")}}, "ppo.config: policy bonbon does not use it"),
        (
            {"reward_model": {"config": str(CONFIGS / "offline/iterate/reward_model.yaml")}},
            "reward_model.config: policy bonbon does not use it",
        ),
        ({"labeler": {"kind": "file", "source": "labels/iter_{t}.jsonl"}}, "labeler.kind file: policy bonbon"),
        ({"bonbon": {"config": str(CONFIGS / "offline/iterate/ppo.yaml")}}, "not BoNBoNModule"),
        ({"bonbon": {"config": "missing.yaml"}}, "bonbon.config missing.yaml: no such file"),
        ({"policy": "dpo"}, "policy must be one of ppo, bonbon"),
        (
            {"bonbon": {"config": str(CONFIGS / "offline/iterate/bonbon.yaml"), "options": ["--data.chat_template"]}},
            "bonbon.options --data.chat_template: iterate sets the BoNBoN data's chat_template",
        ),
    ],
)
def test_a_bad_bonbon_loop_is_one_line_before_any_fit(tmp_path, monkeypatch, keys, named):
    fits = BoNBoNFits()
    result = iterate(bonbon_loop(tmp_path, **keys), fits, monkeypatch, tmp_path)
    assert result.returncode != 0 and named in error_line(result) and fits.calls == []


def test_a_ppo_loop_refuses_bonbon_keys(tmp_path, monkeypatch):
    config = bonbon_loop(
        tmp_path,
        policy="ppo",
        reward_model={"config": str(CONFIGS / "offline/iterate/reward_model.yaml")},
        ppo={"config": str(CONFIGS / "offline/iterate/ppo.yaml")},
    )
    result = iterate(config, BoNBoNFits(), monkeypatch, tmp_path)
    assert result.returncode != 0 and "bonbon.config: policy ppo does not use it" in result.stderr


def test_the_loop_runs_the_real_bonbon_stage(tmp_path, monkeypatch):
    short = ["--trainer.max_epochs", "1", "--trainer.max_steps", "3", "--data.init_args.batch_size", "2"]
    config = bonbon_loop(
        tmp_path,
        bonbon={"config": str(CONFIGS / "offline/iterate/bonbon.yaml"), "options": short},
        prompts={"path": str(TINYSTORIES), "skip": 1000, "words": 6, "held_out": 2, "per_iteration": 8},
    )
    result = iterate(config, in_process_fits, monkeypatch, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "run"
    for t in (1, 2):
        assert (run / f"iter_{t}" / "bonbon" / "model" / EXPORT_MARKER).is_file()
        log = (run / f"iter_{t}" / "bonbon.log").read_text(encoding="utf-8")
        assert "N = 3" in log  # beta derived from the loop's K
    rows = json.loads((run / "summary.json").read_text(encoding="utf-8"))["rows"]
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-4)  # the SFT model against itself
    assert all(row["gold"] is not None and row["kl"] is not None for row in rows)
    # Each fit moved the policy it started from.
    sft, first, second = (weights(p) for p in (STORIES260K, run / "iter_1/bonbon/model", run / "iter_2/bonbon/model"))
    assert any(not torch.equal(first[k], sft[k]) for k in sft)
    assert any(not torch.equal(second[k], first[k]) for k in first)


def weights(export: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(export / "model.safetensors"))


def test_the_shipped_online_bonbon_loop_reads_and_ppo_stays_the_default(monkeypatch):
    from rlhf_lit.commands.iterate_config import IterateConfig, read_config

    monkeypatch.chdir(CONFIGS.parent)  # its paths are the checkout's, as the shipped configs' are
    config = read_config(str(CONFIGS / "offline" / "iterate_bonbon.yaml"))
    assert config.policy == "bonbon" and config.bonbon.config and config.labeler.kind == "judge"
    assert IterateConfig().policy == "ppo"


@pytest.mark.slow
def test_the_shipped_online_bonbon_loop_runs_from_the_console_script(tmp_path):
    """``rlhf-lit iterate --config configs/offline/iterate_bonbon.yaml`` as the docs give it, in the checkout (its
    paths are the checkout's), its run directory moved under ``tmp_path``: exit 0, every iteration's BoNBoN
    export, the summary with a gold score and a KL per row."""
    import subprocess
    import sys

    from suite_env import subprocess_env

    config = yaml.safe_load((CONFIGS / "offline" / "iterate_bonbon.yaml").read_text(encoding="utf-8"))
    config["run_dir"] = str(tmp_path / "run")
    path = tmp_path / "iterate_bonbon.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    cli = Path(sys.executable).parent / "rlhf-lit"
    result = subprocess.run(
        [str(cli), "iterate", "--config", str(path)],
        cwd=CONFIGS.parent,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for t in range(1, config["iterations"] + 1):
        assert (tmp_path / "run" / f"iter_{t}" / "bonbon" / "model" / EXPORT_MARKER).is_file()
    rows = json.loads((tmp_path / "run" / "summary.json").read_text(encoding="utf-8"))["rows"]
    assert len(rows) == config["iterations"] + 1
    assert all(row["gold"] is not None and row["kl"] is not None for row in rows)

"""The verifiable-reward task: its prompt builder (names extracted exactly) and its config parses.

The task itself (three PPO runs) takes minutes and is not run here; see docs/VERIFIABLE.md."""

from __future__ import annotations

import json

import pytest
from cli_in_process import run_main
from suite_env import subprocess_env

from demo.verifiable import ROOT, build_prompts, named_prompt, write_prompt_files


def test_named_prompt_cuts_after_the_naming_sentence():
    p = "Once upon a time, there was a little girl named Lily. She loved to play outside."
    assert named_prompt(p) == {
        "prompt": "Once upon a time, there was a little girl named Lily.",
        "ground_truth": "Lily",
    }
    p = "One day, a boy named Tim went to the park with his mom! It was sunny."
    assert named_prompt(p) == {
        "prompt": "One day, a boy named Tim went to the park with his mom!",
        "ground_truth": "Tim",
    }


def test_named_prompt_skips_paragraphs_without_an_early_name():
    assert named_prompt("The dog was happy. It ran and ran.") is None
    assert named_prompt("He named it.") is None  # "named" followed by no capitalised name
    far = " ".join(["word"] * 30) + " a cat named Tom."
    assert named_prompt(far) is None  # beyond the first 30 words
    assert named_prompt(far, max_words=40)["ground_truth"] == "Tom"


def test_build_prompts_keeps_order_and_names(tmp_path):
    paragraphs = ["A girl named Sue sang.", "Nothing here.", "There was a frog named Hop. He hopped."]
    assert [r["ground_truth"] for r in build_prompts(paragraphs)] == ["Sue", "Hop"]
    path = tmp_path / "val.txt"
    path.write_text("\n\n".join(paragraphs * 3), encoding="utf-8")
    train, held, n_train, n_held = write_prompt_files(str(path), tmp_path / "data", heldout=2)
    rows = [json.loads(line) for line in held.read_text().splitlines()]
    assert (n_train, n_held) == (4, 2)
    assert rows == [
        {"prompt": "A girl named Sue sang.", "ground_truth": "Sue"},
        {"prompt": "There was a frog named Hop.", "ground_truth": "Hop"},
    ]
    assert len(train.read_text().splitlines()) == 4


@pytest.mark.parametrize("estimator,k", [("gae", "1"), ("grpo", "4"), ("rloo", "4")])
def test_verifiable_config_parses_per_estimator(estimator, k):
    # In this process (cli_in_process.run_main: the CLI's entry function, output captured).
    result = run_main(
        "fit",
        "--config",
        "configs/offline/verifiable.yaml",
        "--model.init_args.ppo.estimator",
        estimator,
        "--model.init_args.sampling.samples_per_prompt",
        k,
        "--print_config",
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert f"estimator: {estimator}" in result.stdout
    assert "rlhf_lit.rewards.rules:mentions_ground_truth" in result.stdout


def test_an_out_directory_that_holds_files_is_refused_and_left_untouched(tmp_path):
    import subprocess
    import sys

    (tmp_path / "report.md").write_text("mine\n", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "demo.verifiable", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(),
    )
    assert result.returncode == 2
    assert "exists and is not empty; choose a new directory" in result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"]
    assert (tmp_path / "report.md").read_text(encoding="utf-8") == "mine\n"

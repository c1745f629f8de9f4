"""A reward-model export as the judge (rlhf_lit/evaluation/reward_judge.py): ``rlhf-lit evaluate --judge <dir>``
scores each (prompt as the policy read it, response) with the reward model, as a forward pass of the exported
model computes it; the same directory is PPO's ``judge`` and ``best-of-n --judge``; a directory that is not a
reward-model export is one ``rlhf-lit: error:`` line naming it."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from cli_helpers import STORIES, error_line, ppo_config, run_main, write_yaml
from transformers import AutoModelForSequenceClassification, AutoTokenizer


def prompts_file(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("Once upon a time\nThe dog ran\n", encoding="utf-8")
    return path


def forward_score(model, tokenizer, prompt: str, response: str) -> float:
    """The exported reward model's score of one pair, written out from the rule the judge documents for a model
    trained on plain prompts: the tokenizer's BOS, the tokens of prompt + response, the EOS; the score head at
    the last token, plus the normalisation offset the config keeps (0 when folded into the weights)."""
    ids = tokenizer(prompt + response, add_special_tokens=False)["input_ids"]
    row = torch.tensor([[tokenizer.bos_token_id, *ids, tokenizer.eos_token_id]])
    with torch.no_grad():
        logit = model(input_ids=row, attention_mask=torch.ones_like(row)).logits[0, 0].item()
    return logit + float(getattr(model.config, "reward_bias", 0.0) or 0.0)


def test_evaluate_judges_with_a_reward_model_export_as_its_forward_pass_scores(tmp_path, offline_chain):
    rm = offline_chain.export("reward_model")
    assert json.loads((rm / "rlhf_lit_export.json").read_text())["chat_rendered"] is False  # recorded by the stage
    out = tmp_path / "eval.json"
    result = run_main(
        "evaluate",
        "--policy",
        str(offline_chain.export("sft")),
        "--prompts",
        str(prompts_file(tmp_path)),
        "--samples-per-prompt",
        "3",
        "--max-new-tokens",
        "8",
        "--judge",
        str(rm),
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    samples = json.loads(out.read_text())["samples"]
    assert len(samples) == 6
    model = AutoModelForSequenceClassification.from_pretrained(rm).eval()
    tokenizer = AutoTokenizer.from_pretrained(rm)
    want = [forward_score(model, tokenizer, s["prompt_text"], s["response"]) for s in samples]
    torch.testing.assert_close(torch.tensor([s["judge"] for s in samples]), torch.tensor(want))
    assert len(set(want)) > 1  # the responses differ, and so do their scores


def test_ppo_and_best_of_n_take_a_reward_model_export_as_judge(tmp_path, offline_chain):
    rm = str(offline_chain.export("reward_model"))
    config = ppo_config(tmp_path, STORIES, rm, max_rollouts=2, judge=rm)
    result = run_main("fit", "--config", str(write_yaml(tmp_path / "ppo.yaml", config)), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (metrics,) = (tmp_path / "logs").rglob("metrics.csv")
    header, *rows = [line.split(",") for line in metrics.read_text().splitlines()]
    judged = [float(row[header.index("objective/judge")]) for row in rows if row[header.index("objective/judge")]]
    assert len(judged) == 2 and all(math.isfinite(x) for x in judged)

    out = tmp_path / "bon.json"
    argv = ["--policy", str(STORIES), "--reward-model", rm, "--prompts", str(prompts_file(tmp_path))]
    result = run_main(
        "best-of-n", *argv, "--n-max", "2", "--max-new-tokens", "6", "--judge", rm, "--out", str(out), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [row["n"] for row in rows] == [1, 2] and all(math.isfinite(row["judge_mean"]) for row in rows)


def damaged_marker(tmp_path, offline_chain):
    copy = tmp_path / "rm-copy"
    shutil.copytree(offline_chain.export("reward_model"), copy)
    (copy / "rlhf_lit_export.json").write_text('{"what": "reward mo', encoding="utf-8")  # a copy cut short
    return copy, "its marker is damaged", "cut short"


def not_an_export(tmp_path, offline_chain):
    return STORIES, "not an rlhf-lit export (no rlhf_lit_export.json)", "reward-model export"


def another_kind(tmp_path, offline_chain):
    return offline_chain.export("sft"), "an rlhf-lit export of a SFT model, not of a reward model", "module:function"


def missing(tmp_path, offline_chain):
    return tmp_path / "nowhere" / "rm", "no such directory", "module:function"


@pytest.mark.parametrize("case", [damaged_marker, not_an_export, another_kind, missing])
def test_a_judge_directory_that_is_not_a_reward_model_export_is_one_error_naming_it(tmp_path, offline_chain, case):
    path, what, hint = case(tmp_path, offline_chain)
    argv = ["--policy", str(STORIES), "--prompts", str(prompts_file(tmp_path)), "--judge", str(path)]
    result = run_main("evaluate", *argv, cwd=tmp_path)
    assert result.returncode != 0
    line = error_line(result)
    assert f"--judge {path}" in line and what in line and hint in line, line

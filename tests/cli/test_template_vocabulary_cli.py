"""``--chat-template`` of ``rlhf-lit evaluate`` and ``rlhf-lit best-of-n`` speaks the one vocabulary
(rlhf_lit/data/rendering.py): ``auto | always | never``, with ``hh_render``'s older
``chat_template`` / ``raw`` accepted as aliases that run exactly as ``always`` / ``never``."""

from __future__ import annotations

import json

import pytest
from assets_paths import ROOT, STORIES260K_CHAT
from cli_helpers import error_line, run_main

CHAT = str(STORIES260K_CHAT)
PAIRS = [("chat_template", "always"), ("raw", "never")]


def run(tmp_path, command: str, value: str, *extra: str) -> dict:
    """``rlhf-lit <command> --chat-template <value>`` on two string prompts; the JSON it wrote."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("Once upon a time\nThe cat\n", encoding="utf-8")
    out = tmp_path / f"{command}-{value}.json"
    result = run_main(
        command,
        "--policy",
        CHAT,
        "--prompts",
        str(prompts),
        "--max-new-tokens",
        "4",
        "--chat-template",
        value,
        "--out",
        str(out),
        *extra,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize(("alias", "canonical"), PAIRS)
def test_evaluate_runs_an_alias_as_its_canonical_value(tmp_path, alias, canonical):
    by_alias, by_name = run(tmp_path, "evaluate", alias), run(tmp_path, "evaluate", canonical)
    assert by_alias["config"]["chat_template"] == by_name["config"]["chat_template"] == canonical
    assert by_alias["samples"] == by_name["samples"]  # the same prompt texts, so the same draws
    rendered = canonical == "always"
    assert by_alias["samples"][0]["prompt_text"].startswith("<s>User: ") is rendered


@pytest.mark.parametrize(("alias", "canonical"), PAIRS)
def test_best_of_n_runs_an_alias_as_its_canonical_value(tmp_path, alias, canonical, stories_rm):
    extra = ("--reward-model", stories_rm, "--n", "1")
    by_alias, by_name = run(tmp_path, "best-of-n", alias, *extra), run(tmp_path, "best-of-n", canonical, *extra)
    assert by_alias["config"]["chat_template"] == by_name["config"]["chat_template"] == canonical
    assert by_alias["prompt_texts"] == by_name["prompt_texts"]
    assert by_alias["samples"] == by_name["samples"]


@pytest.mark.parametrize("command", ["evaluate", "best-of-n"])
def test_a_bad_value_is_one_line_naming_the_option_and_the_canonical_choices(tmp_path, command):
    (tmp_path / "p.txt").write_text("Once upon a time\n", encoding="utf-8")
    result = run_main(
        command,
        "--policy",
        CHAT,
        "--reward-model",
        CHAT,
        "--prompts",
        str(tmp_path / "p.txt"),
        "--chat-template",
        "yes",
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert error_line(result) == "rlhf-lit: error: --chat-template must be one of auto, always, never; got 'yes'"


def test_the_help_lists_the_canonical_choices(tmp_path):
    result = run_main("evaluate", "--help", cwd=tmp_path)
    assert "--chat-template {auto,always,never}" in result.stdout


@pytest.mark.parametrize("value", ["auto", "always", "never", "chat_template", "raw"])
def test_a_fit_config_takes_hh_render_in_either_spelling(value):
    # --print_config parses the options against the data module's signature (jsonargparse): an alias
    # must pass as the canonical values do, to reach template_choice.
    config = ROOT / "configs/classic_gpt2/reward_model.yaml"
    result = run_main("fit", "--config", str(config), "--data.hh_render", value, "--print_config", cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"hh_render: {value}" in result.stdout

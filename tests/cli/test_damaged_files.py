"""What a crash, a full disk or a cut-short copy leaves behind, met through `rlhf-lit` with one message.

Every file rlhf-lit reads back (a checkpoint given with ``--ckpt_path``, the files of an export:
weights, ``config.json``, tokenizer files, the export marker, an ensemble's ``ensemble.json``) is
damaged in each way it can be (cut short, zero bytes, another format, JSON that does not parse, a
missing part) and read by each command that reads it: the run stops before any model is loaded
with one ``rlhf-lit: error:`` line naming the file and what is wrong, and writes nothing. A
damaged ``last.ckpt`` names the newest intact checkpoint beside it and the command resuming from it,
and that command resumes. A disk that fills up while a checkpoint is written keeps every earlier
checkpoint and the export intact (tests/cli/test_run_lock.py: two runs on one run directory).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_helpers import STORIES, error_line, ppo_config, run_main, write_yaml
from damage import damage_file

from rlhf_lit.stages.export import MARKER

# ------------------------------------------------------------------------------------ exports read by PPO

EXPORT_CASES = [
    # (PPO option, file in the export, damage, what the message says is wrong)
    ("sft_model", "model.safetensors", "truncated", "cut short ("),
    ("sft_model", "model.safetensors", "empty", "the file is empty (0 bytes)"),
    ("sft_model", "model.safetensors", "not_the_format", "not a safetensors file"),
    ("sft_model", "model.safetensors", "missing", "holds no weights"),
    ("sft_model", "tokenizer.json", "truncated", "cut short (line "),
    ("sft_model", "tokenizer.json", "empty", "the file is empty (0 bytes)"),
    ("sft_model", "tokenizer_config.json", "not_the_format", "not valid JSON (line 1, column 1"),
    ("sft_model", MARKER, "unparsable", "not valid JSON (line 1, column 2"),
    ("sft_model", "generation_config.json", "truncated", "cut short (line"),
    ("sft_model", "config.json", "not_the_format", "not valid JSON (line 1, column 1"),
    ("reward_model", "model.safetensors", "truncated", "cut short ("),
    ("reward_model", "config.json", "truncated", "cut short (line"),
    ("reward_model", "config.json", "empty", "the file is empty (0 bytes)"),
    ("reward_model", "config.json", "unparsable", "not valid JSON (line 1, column 2"),
    ("reward_model", MARKER, "empty", "the file is empty (0 bytes)"),
    ("reward_model", "model.safetensors", "empty", "the file is empty (0 bytes)"),
    ("reward_model", "tokenizer.json", "unparsable", "not valid JSON (line 1, column 2"),
]


def _export_copy(source: str | Path, folder: Path) -> Path:
    """A copy of a saved model with an rlhf-lit export marker, as a stage writes it."""
    shutil.copytree(source, folder)
    (folder / MARKER).write_text(json.dumps({"what": "model", "written": "2026-01-01T00:00:00+00:00"}) + "\n")
    return folder


@pytest.mark.parametrize(("option", "name", "damage", "problem"), EXPORT_CASES, ids=lambda v: str(v))
def test_a_damaged_export_is_named_before_any_model_is_loaded(tmp_path, stories_rm, option, name, damage, problem):
    sft = _export_copy(STORIES, tmp_path / "sft")
    rm = _export_copy(stories_rm, tmp_path / "rm")
    damaged = {"sft_model": sft, "reward_model": rm}[option]
    damage_file(damaged / name, damage)
    write_yaml(tmp_path / "ppo.yaml", ppo_config(tmp_path, sft, rm))
    result = run_main("fit", "--config", "ppo.yaml", cwd=tmp_path)
    assert result.returncode == 1
    file = damaged if damage == "missing" else damaged / name
    assert error_line(result).startswith(f"rlhf-lit: error: {option} '{damaged}' cannot be loaded: {file}: {problem}")
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "export").exists()


@pytest.mark.parametrize("option", ["sft_model", "reward_model"])
def test_an_export_missing_its_tokenizer_json_is_not_taken_for_one_without_a_tokenizer(tmp_path, stories_rm, option):
    # tokenizer_config.json is there, tokenizer.json is not (a copy cut short): the RM's vocabulary and chat-template
    # checks must not fall back to "saved without a tokenizer" and let the run go on unchecked, and the policy's
    # tokenizer is named, not "Couldn't instantiate the backend tokenizer".
    sft, rm = _export_copy(STORIES, tmp_path / "sft"), _export_copy(stories_rm, tmp_path / "rm")
    damaged = {"sft_model": sft, "reward_model": rm}[option]
    damage_file(damaged / "tokenizer.json", "missing")
    write_yaml(tmp_path / "ppo.yaml", ppo_config(tmp_path, sft, rm))
    result = run_main("fit", "--config", "ppo.yaml", cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    assert error_line(result).startswith(
        f"rlhf-lit: error: {option} '{damaged}' cannot be loaded: its tokenizer "
        "files (tokenizer_config.json) do not load ("
    )
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "export").exists()


CHAT_TEMPLATE = "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (CHAT_TEMPLATE[:40], "cut short (line 1: "),
        ("", "the file is empty (0 bytes)"),
        (CHAT_TEMPLATE + "{% endfor %}", "not valid Jinja (line 2: Encountered unknown tag 'endfor'.)"),
        ("{{ bos_token }}\n{{ messages[0]['content'] + }}", "not valid Jinja (line 2: unexpected 'end of print"),
    ],
    ids=["truncated", "empty", "stray-end-tag", "bad-expression"],
)
def test_a_damaged_chat_template_file_is_named_not_taken_for_no_template(tmp_path, stories_rm, text, problem):
    # transformers reads chat_template.jinja as it is: an empty one is "no chat template" (prompts rendered
    # without one), a cut one fails only when the first prompt is rendered.
    from rlhf_lit.sources import check_chat_templates

    sft = _export_copy(STORIES, tmp_path / "sft")
    (sft / "chat_template.jinja").write_text(CHAT_TEMPLATE + "{% generation %}{% endgeneration %}")
    check_chat_templates(str(sft))  # whole (a tag only transformers knows included): accepted
    (sft / "chat_template.jinja").write_text(text)
    write_yaml(tmp_path / "ppo.yaml", ppo_config(tmp_path, sft, _export_copy(stories_rm, tmp_path / "rm")))
    result = run_main("fit", "--config", "ppo.yaml", cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    assert error_line(result).startswith(
        f"rlhf-lit: error: sft_model '{sft}' cannot be loaded: {sft / 'chat_template.jinja'}: {problem}"
    )


def test_a_broken_chat_template_in_tokenizer_config_is_named_before_loading(tmp_path, stories_rm):
    """A template held in tokenizer_config.json (older exports) is checked as a file's is, even where the data
    never render through it: it would otherwise be copied into the next export without a word."""
    sft = _export_copy(STORIES, tmp_path / "sft")
    config = json.loads((sft / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "default", "template": CHAT_TEMPLATE + "{% endif %}"}]
    (sft / "tokenizer_config.json").write_text(json.dumps(config))
    (sft / "chat_template.jinja").unlink(missing_ok=True)
    write_yaml(tmp_path / "ppo.yaml", ppo_config(tmp_path, sft, _export_copy(stories_rm, tmp_path / "rm")))
    result = run_main("fit", "--config", "ppo.yaml", cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    assert error_line(result) == (
        f"rlhf-lit: error: sft_model '{sft}' cannot be loaded: {sft / 'tokenizer_config.json'} "
        "(chat_template 'default'): not valid Jinja (line 2: Encountered unknown tag 'endif'.)"
    )
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "export").exists()


@pytest.fixture
def ensemble(tmp_path, stories_rm) -> Path:
    """A reward-model ensemble of one member (a copy of the stories RM), as the RM stage exports it."""
    root = tmp_path / "ensemble"
    _export_copy(stories_rm, root / "members" / "member_0")
    manifest = {
        "format": "rlhf-lit-reward-ensemble",
        "version": 1,
        "design": {},
        "members": [{"path": "members/member_0", "seed": 0, "normalization": None}],
    }
    (root / "ensemble.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (root / MARKER).write_text(json.dumps({"what": "reward-model ensemble"}) + "\n")
    return root


@pytest.mark.parametrize(
    ("damage", "problem"),
    [("truncated", "cut short (line"), ("empty", "the file is empty"), ("unparsable", "not valid JSON")],
)
def test_a_damaged_ensemble_manifest_is_named(tmp_path, ensemble, damage, problem):
    damage_file(ensemble / "ensemble.json", damage)
    write_yaml(tmp_path / "ppo.yaml", ppo_config(tmp_path, STORIES, ensemble))
    result = run_main("fit", "--config", "ppo.yaml", cwd=tmp_path)
    assert result.returncode == 1
    assert f"{ensemble / 'ensemble.json'}: {problem}" in error_line(result)
    # the same file through the commands, before any model is loaded
    best = run_main(
        "best-of-n",
        "--policy",
        str(STORIES),
        "--reward-model",
        str(ensemble),
        "--prompts",
        str(tmp_path / "prompts.txt"),
        "--out",
        "bon.json",
        cwd=tmp_path,
    )
    assert best.returncode != 0 and "Traceback" not in best.stderr
    assert f"{ensemble / 'ensemble.json'}: {problem}" in best.stderr


def test_a_damaged_ensemble_member_is_named_by_the_commands(tmp_path, ensemble):
    damage_file(ensemble / "members" / "member_0" / "model.safetensors", "truncated")
    (tmp_path / "prompts.txt").write_text("Once upon a time\n")
    best = run_main(
        "best-of-n",
        "--policy",
        str(STORIES),
        "--reward-model",
        str(ensemble),
        "--prompts",
        "prompts.txt",
        "--out",
        "bon.json",
        cwd=tmp_path,
    )
    assert best.returncode == 1 and "Traceback" not in best.stderr, best.stderr[-3000:]
    assert f"{ensemble / 'members' / 'member_0' / 'model.safetensors'}: cut short (" in best.stderr


COMMAND_CASES = [
    # (command, option, file, damage, problem)
    ("evaluate", "--policy", "model.safetensors", "truncated", "cut short ("),
    ("evaluate", "--policy", "tokenizer.json", "not_the_format", "not valid JSON"),
    ("best-of-n", "--reward-model", "config.json", "empty", "the file is empty (0 bytes)"),
    ("best-of-n", "--reward-model", "model.safetensors", "not_the_format", "not a safetensors file"),
]


@pytest.mark.parametrize(("command", "option", "name", "damage", "problem"), COMMAND_CASES, ids=lambda v: str(v))
def test_the_commands_name_a_damaged_export(tmp_path, stories_rm, command, option, name, damage, problem):
    policy = _export_copy(STORIES, tmp_path / "policy")
    rm = _export_copy(stories_rm, tmp_path / "rm")
    damaged = policy if option == "--policy" else rm
    damage_file(damaged / name, damage)
    (tmp_path / "prompts.txt").write_text("Once upon a time\n")
    extra = ("--reward-model", str(rm)) if command == "best-of-n" else ()
    result = run_main(
        command, "--policy", str(policy), *extra, "--prompts", "prompts.txt", "--out", "out.json", cwd=tmp_path
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    line = next(line for line in result.stderr.splitlines() if str(damaged / name) in line)
    assert f"{option} '{damaged}' cannot be loaded: {damaged / name}: {problem}" in line
    assert not (tmp_path / "out.json").exists()

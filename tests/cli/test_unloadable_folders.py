"""Model folders whose files are intact but whose contents transformers cannot load, met with one message.

The integrity checks (tests/cli/test_damaged_files.py) pass every file here: each parses. What is wrong is
a value: a ``config.json`` edited to another ``vocab_size`` or ``hidden_size`` than the weights have, a dtype
torch does not know, a ``tokenizer.json`` of a model type the tokenizers library does not know. Before, each
ended in a traceback (transformers' ``RuntimeError`` after a multi-line load report, an ``AttributeError``,
the tokenizers library's bare ``Exception``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_helpers import STORIES, error_line, ppo_config, run_main, write_yaml


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=1))


EDITS = {
    "vocab_size": ("config.json", lambda c: c.update(vocab_size=c["vocab_size"] + 7)),
    "hidden_size": ("config.json", lambda c: c.update(hidden_size=c["hidden_size"] * 2)),
    "dtype": ("config.json", lambda c: c.update(dtype="float99", torch_dtype="float99")),
    "tokenizer_type": ("tokenizer.json", lambda t: t["model"].update(type="NoSuchModel")),
}
EXPECTED = {
    "vocab_size": "its weights do not have the shapes its config.json gives (model.embed_tokens.weight: "
    "the weights hold [512, 64], config.json makes [519, 64])",
    "hidden_size": "its weights do not have the shapes its config.json gives (",
    "dtype": "(AttributeError: module 'torch' has no attribute 'float99'): a value of its config.json",
    "tokenizer_type": "its tokenizer files (tokenizer.json, tokenizer_config.json) do not load (",
}


def edited_copy(source: str | Path, folder: Path, edit: str) -> Path:
    """A copy of ``source`` with one of :data:`EDITS` made to it."""
    shutil.copytree(source, folder)
    name, change = EDITS[edit]
    _edit_json(folder / name, change)
    return folder


@pytest.mark.parametrize("edit", list(EDITS))
def test_evaluate_names_a_policy_folder_transformers_cannot_load(tmp_path, edit):
    policy = edited_copy(STORIES, tmp_path / "policy", edit)
    (tmp_path / "prompts.txt").write_text("Once upon a time\n")
    result = run_main(
        "evaluate", "--policy", str(policy), "--prompts", "prompts.txt", "--max-new-tokens", "4",
        "--out", "out.json", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    line = error_line(result)
    assert f"'{policy}' cannot be loaded" in line and EXPECTED[edit] in line, line
    assert "LOAD REPORT" not in result.stderr  # the table transformers prints before raising is not shown
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("edit", ["vocab_size", "dtype"])
def test_ppo_names_a_reward_model_folder_transformers_cannot_load(tmp_path, stories_rm, edit):
    rm = edited_copy(stories_rm, tmp_path / "rm", edit)
    write_yaml(tmp_path / "ppo.yaml", ppo_config(tmp_path, Path(STORIES), rm))
    result = run_main("fit", "--config", "ppo.yaml", cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    line = error_line(result)
    assert f"'{rm}' cannot be loaded" in line and EXPECTED[edit].split(" (model.")[0] in line, line
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "export").exists()


def test_the_load_report_of_a_model_that_loads_is_still_printed(tmp_path, caplog):
    """Holding the report back (to name a mismatch in one line) must not hide it when the model loads: an
    unexpected weight is reported as transformers reports it."""
    import logging

    from safetensors.torch import load_file, save_file

    from rlhf_lit.models import load_causal_lm

    folder = Path(shutil.copytree(STORIES, tmp_path / "extra"))
    weights = load_file(folder / "model.safetensors")
    save_file({**weights, "unused.weight": weights["model.norm.weight"].clone()}, folder / "model.safetensors")
    with caplog.at_level(logging.WARNING, logger="transformers.modeling_utils"):
        load_causal_lm(str(folder))
    assert "LOAD REPORT" in caplog.text and "unused.weight" in caplog.text

"""A config file that is not what `rlhf-lit fit` reads, or a group of options given the wrong type: one
`rlhf-lit: error:` line naming the file (its line, when a value is at fault) and the key; exit 2, no traceback.

A file as a whole: not UTF-8, empty or only comments, a list or a plain value at the top, a key written
twice. A value: a group of options (``optimizer``, ``ppo``, ``trainer``, a stage's ``init_args``) given a
number, a list or null, in the config, in an overlay config or as an option, and a file of a group's
options that is not what it should be. The cases call the CLI's entry function in this process
(``run_main``, with ``--print_config``: parse only); one runs in a process of its own.
"""

from __future__ import annotations

from pathlib import Path

import cli_forked
import pytest
from cli_helpers import ROOT, error_line, run_main

from rlhf_lit.config_files import read_yaml_mapping

OFFLINE = ROOT / "configs" / "offline"
SHAPE = "a config file is a mapping of keys (trainer:, model:, data:, ...)"


def _refused(result) -> str:
    """The one error line of a refused parse (exit 2, nothing on stdout, no traceback), without its prefix."""
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stdout == ""
    return error_line(result).removeprefix("rlhf-lit: error: ")


def _parse(*args: str):
    """``rlhf-lit fit <args> --print_config`` in this process, from the project root (the configs' relative paths)."""
    return run_main("fit", *args, "--print_config", cwd=ROOT)


def _write(tmp_path: Path, data: bytes, name: str = "bad.yaml") -> str:
    """A file of these bytes in ``tmp_path``; its path as a user passes it."""
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


SFT = (OFFLINE / "sft.yaml").read_text(encoding="utf-8")
SFT_LINES = SFT.splitlines()

# (the file's bytes, what follows "--config <path>" in the message)
WHOLE_FILE = {
    "latin-1-comment": ("# Démo\n".encode("latin-1") + SFT.encode(), ", line 1, column 4: not UTF-8 text (byte 0xe9)"),
    "latin-1-value": (
        SFT.replace("format: paragraphs", "format: café").encode("latin-1"),
        f", line {SFT_LINES.index('    format: paragraphs') + 1}, column 16: not UTF-8 text (byte 0xe9)",
    ),
    "empty": (b"", ": no settings in it (the file is empty or holds only comments)"),
    "only-comments": (b"# to fill in\n\n# later\n", ": no settings in it (the file is empty or holds only comments)"),
    "a-list": (b"# a list\n- model: x\n- data: y\n", ", line 2: the file holds a list"),
    "a-word": (b"configs/offline/sft.yaml\n", ", line 1: the file holds a plain value ('configs/offline/sft.yaml')"),
    "a-number": (b"5\n", ", line 1: the file holds a plain value ('5')"),
    "a-key-twice": (
        (SFT + "seed_everything: 7\n").encode(),
        f", line {len(SFT_LINES) + 1}: seed_everything given twice in one mapping (first at line "
        f"{SFT_LINES.index('seed_everything: 1234') + 1}); keep one",
    ),
    "a-nested-key-twice": (
        SFT.replace("      lr: 5.0e-4\n", "      lr: 5.0e-4\n      lr: 1.0e-3\n").encode(),
        f", line {SFT_LINES.index('      lr: 5.0e-4') + 2}: model.init_args.optimizer.lr given twice in one "
        f"mapping (first at line {SFT_LINES.index('      lr: 5.0e-4') + 1}); keep one",
    ),
}


@pytest.mark.parametrize("overlay", [False, True], ids=["the-config", "an-overlay"])
@pytest.mark.parametrize("case", list(WHOLE_FILE))
def test_a_config_file_that_is_no_mapping_of_keys_is_named(tmp_path, case, overlay):
    data, told = WHOLE_FILE[case]
    path = _write(tmp_path, data)
    first = ["--config", str(OFFLINE / "sft.yaml")] if overlay else []
    message = _refused(_parse(*first, "--config", path))
    assert message.startswith(f"--config {path}{told}"), message
    if case in ("empty", "only-comments", "a-list", "a-word", "a-number"):
        assert message.endswith(SHAPE)


def test_a_config_file_that_is_not_utf8_is_named_by_the_console_command(tmp_path):
    # In a process of its own, as a user runs it: jsonargparse reads the file with the locale's codec.
    _write(tmp_path, WHOLE_FILE["latin-1-comment"][0], "sft.yaml")
    result = cli_forked.run("fit", "--config", "sft.yaml", "--print_config", cwd=tmp_path)
    assert result.returncode == 2
    assert error_line(result) == (
        "rlhf-lit: error: --config sft.yaml, line 1, column 4: not UTF-8 text (byte 0xe9); save the file as UTF-8"
    )


# (the stage's config, an overlay, the line named, the key named, whose options, the value as told)
WRONG_GROUPS = {
    "optimizer-a-number": ("sft", "model:\n  init_args:\n    optimizer: 5\n", 3, "model.init_args.optimizer", "OptimizerConfig", "5"),
    "optimizer-a-list": ("sft", "model:\n  init_args:\n    optimizer: [1, 2]\n", 3, "model.init_args.optimizer", "OptimizerConfig", "[1, 2]"),
    "optimizer-null": ("sft", "model:\n  init_args:\n    optimizer: null\n", 3, "model.init_args.optimizer", "OptimizerConfig", "null"),
    "ppo-a-number": ("ppo", "model:\n  init_args:\n    ppo: 4\n", 3, "model.init_args.ppo", "PPOConfig", "4"),
    "init_args-a-number": ("sft", "model:\n  init_args: 5\n", 2, "model.init_args", "SFTModule", "5"),
    "data-init_args-a-list": ("sft", "data:\n  init_args: [train.txt]\n", 2, "data.init_args", "SFTDataModule", "['train.txt']"),
    "trainer-a-list": ("sft", "trainer: [cpu]\n", 1, "trainer", "Trainer", "['cpu']"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(WRONG_GROUPS))
def test_a_group_given_something_else_than_a_mapping_names_the_file_line_and_key(tmp_path, case):
    stage, overlay, line, key, owner, value = WRONG_GROUPS[case]
    path = _write(tmp_path, overlay.encode(), "overlay.yaml")
    message = _refused(_parse("--config", str(OFFLINE / f"{stage}.yaml"), "--config", path))
    assert message == f"{path}, line {line}: {key}: expected a mapping of {owner}'s options, got {value}"


def test_a_group_given_a_number_in_the_config_itself_names_its_line(tmp_path):
    text = SFT.replace(
        "    optimizer:\n      lr: 5.0e-4\n      warmup_steps: 10\n      schedule: cosine\n", "    optimizer: 5\n"
    )
    path = _write(tmp_path, text.encode(), "sft.yaml")
    line = text.splitlines().index("    optimizer: 5") + 1
    assert _refused(_parse("--config", path)) == (
        f"{path}, line {line}: model.init_args.optimizer: expected a mapping of OptimizerConfig's options, got 5"
    )


OPTIONS = {
    "a-number": (None, "5", "expected a mapping of OptimizerConfig's options, got 5"),
    "a-file-of-a-number": (
        b"5\n",
        "",
        "expected a mapping of OptimizerConfig's options, got {}, a file that holds no mapping",
    ),
    "a-file-of-a-list": (
        b"- lr: 1\n",
        "",
        "expected a mapping of OptimizerConfig's options, got {}, a file that holds no mapping",
    ),
    "a-file-not-yaml": (
        b"lr: [1\n",
        "",
        "{}, line 2, column 1: did not find expected ',' or ']' (while parsing a flow sequence that starts at line 1, column 5)",
    ),
    "a-file-not-utf8": (
        "# r\xe9glages\nlr: 1\n".encode("latin-1"),
        "",
        "{}, line 1, column 4: not UTF-8 text (byte 0xe9); save the file as UTF-8",
    ),
}


@pytest.mark.parametrize("case", list(OPTIONS))
def test_a_group_option_given_the_wrong_value_or_file_names_the_option(tmp_path, case):
    data, value, told = OPTIONS[case]
    if data is not None:
        value = _write(tmp_path, data, "optimizer.yaml")
    result = _parse("--config", str(OFFLINE / "sft.yaml"), "--model.init_args.optimizer", value)
    assert _refused(result) == f"option --model.init_args.optimizer: {told.format(value)}"


def test_a_top_level_group_option_given_a_number_is_named():
    assert _refused(_parse("--config", str(OFFLINE / "sft.yaml"), "--trainer", "5")) == (
        "option --trainer: expected a mapping of Trainer's options, got 5"
    )


def test_a_group_still_takes_a_mapping_or_a_file_of_one(tmp_path):
    path = _write(tmp_path, b"lr: 0.25\nwarmup_steps: 3\n", "optimizer.yaml")
    for value in (path, "{lr: 0.25, warmup_steps: 3}"):
        result = _parse("--config", str(OFFLINE / "sft.yaml"), "--model.init_args.optimizer", value)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "    optimizer:\n      lr: 0.25\n" in result.stdout


def test_the_commands_reader_names_a_config_that_is_not_utf8(tmp_path):
    # `rlhf-lit iterate` and the data package read a config with read_yaml_mapping: the same words.
    path = _write(tmp_path, "seed: 1\nnote: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError) as refused:
        read_yaml_mapping(path)
    assert str(refused.value) == f"{path}, line 2, column 10: not UTF-8 text (byte 0xe9); save the file as UTF-8"

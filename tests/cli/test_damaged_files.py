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

import errno
import json
import shlex
import shutil
import zipfile
from pathlib import Path

import pytest
import torch
from cli_helpers import STORIES, TINYSTORIES, error_line, ppo_config, run_main, sft_config, write_yaml

from rlhf_lit.integrity import check_checkpoint
from rlhf_lit.stages.export import MARKER

NOT_THE_FORMAT = b"<html><body>502 Bad Gateway</body></html>\n"
"""What a failed download saves under the file's name: another format altogether."""


def _cut(data: bytes) -> bytes:
    return data[: len(data) // 2]


DAMAGES = {
    "truncated": _cut,
    "empty": lambda data: b"",
    "not_the_format": lambda data: NOT_THE_FORMAT,
    "unparsable": lambda data: data.replace(b"{", b"{,", 1),
}
"""Each damage as bytes -> bytes (``unparsable``: a JSON file with one stray comma)."""


def _drop_a_tensor(data: bytes, path: Path) -> None:
    """Write ``data`` (a torch zip) to ``path`` without one of its tensor records: a missing member."""
    source = path.with_suffix(".whole")
    source.write_bytes(data)
    with zipfile.ZipFile(source) as whole, zipfile.ZipFile(path, "w") as part:
        dropped = [n for n in whole.namelist() if "/data/" in n][-1]
        for name in whole.namelist():
            if name != dropped:
                part.writestr(name, whole.read(name))
    source.unlink()


def _damage(path: Path, damage: str) -> None:
    """Damage the file at ``path`` in place (``missing``: delete it; ``missing_member``: drop a tensor)."""
    data = path.read_bytes()
    if damage == "missing":
        path.unlink()
    elif damage == "missing_member":
        _drop_a_tensor(data, path)
    else:
        path.write_bytes(DAMAGES[damage](data))


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
    _damage(damaged / name, damage)
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
    _damage(damaged / "tokenizer.json", "missing")
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
    _damage(ensemble / "ensemble.json", damage)
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
    _damage(ensemble / "members" / "member_0" / "model.safetensors", "truncated")
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
    _damage(damaged / name, damage)
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


# ------------------------------------------------------------------------------------ checkpoints


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory) -> Path:
    """An SFT run of 4 steps with a checkpoint every 2: ``ckpt/`` holds step 2, step 4 and ``last.ckpt``.

    Its paths are relative (``ckpt``, ``export``, ``logs``), so a copy of the folder is a run of its own."""
    root = tmp_path_factory.mktemp("sft-run")
    config = sft_config(Path("."), TINYSTORIES, max_steps=4)
    config["trainer"]["callbacks"][0]["init_args"]["save_top_k"] = -1  # keep step 2 beside step 4
    write_yaml(root / "sft.yaml", config)
    result = run_main("fit", "--config", "sft.yaml", cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    return root


def _run_copy(sft_run: Path, tmp_path: Path) -> Path:
    """A private copy of the SFT run (modification times kept: they order the checkpoints)."""
    return Path(shutil.copytree(sft_run, tmp_path / "run", copy_function=shutil.copy2))


@pytest.mark.parametrize("damage", ["truncated", "empty", "not_the_format", "missing_member", "missing"])
def test_a_damaged_checkpoint_is_named_before_any_model_is_loaded(sft_run, tmp_path, damage):
    run = _run_copy(sft_run, tmp_path)
    (step2,) = (run / "ckpt").glob("*step=2.ckpt")
    _damage(step2, damage)
    result = run_main("fit", "--config", "sft.yaml", "--ckpt_path", f"ckpt/{step2.name}", cwd=run)
    assert result.returncode == 1
    problem = {
        "truncated": "cut short (",
        "empty": "the file is empty (0 bytes)",
        "not_the_format": "not a PyTorch checkpoint (it does not start as a zip archive)",
        "missing_member": "incomplete checkpoint: 1 tensor record(s) missing",
        "missing": "no such file",
    }[damage]
    assert error_line(result).startswith(f"rlhf-lit: error: --ckpt_path ckpt/{step2.name}: {problem}")
    assert "the newest intact" not in result.stderr  # only last.ckpt points elsewhere


def test_a_damaged_last_checkpoint_names_the_newest_intact_one_and_its_command_resumes(sft_run, tmp_path):
    run = _run_copy(sft_run, tmp_path)
    (step4,) = (run / "ckpt").glob("*step=4.ckpt")
    _damage(run / "ckpt" / "last.ckpt", "truncated")
    given = (
        "fit",
        "--config",
        "sft.yaml",
        "--ckpt_path",
        "ckpt/last.ckpt",
        "--trainer.max_steps",
        "5",
        "--model.init_args.export_existing",
        "replace",
    )
    result = run_main(*given, cwd=run)
    assert result.returncode == 1
    line = error_line(result)
    assert line.startswith("rlhf-lit: error: --ckpt_path ckpt/last.ckpt: cut short (")
    assert f"the newest intact checkpoint beside it is ckpt/{step4.name}: resume from it with `" in line
    command = shlex.split(line.split("`")[1])
    assert command[:2] == ["rlhf-lit", "fit"] and command[-2:] == ["--ckpt_path", f"ckpt/{step4.name}"]
    resumed = run_main(*command[1:], cwd=run)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert torch.load(run / "ckpt" / "last.ckpt", map_location="cpu", weights_only=True)["global_step"] == 5


def test_a_damaged_last_checkpoint_alone_says_to_start_again(sft_run, tmp_path):
    run = _run_copy(sft_run, tmp_path)
    for ckpt in (run / "ckpt").glob("*.ckpt"):
        _damage(ckpt, "empty")
    result = run_main("fit", "--config", "sft.yaml", "--ckpt_path", "ckpt/last.ckpt", cwd=run)
    assert result.returncode == 1
    assert error_line(result) == (
        "rlhf-lit: error: --ckpt_path ckpt/last.ckpt: the file is empty (0 bytes); no intact "
        "checkpoint beside it to resume from: start the run again without --ckpt_path"
    )


def test_ckpt_path_last_is_checked_where_lightning_resolves_and_loads_it(sft_run, tmp_path):
    # `--ckpt_path last` names no file until Lightning resolves it inside fit: a damaged last.ckpt is
    # named there, with what to resume from, not met with torch's zip-reader traceback.
    run = _run_copy(sft_run, tmp_path)
    (step4,) = (run / "ckpt").glob("*step=4.ckpt")
    _damage(run / "ckpt" / "last.ckpt", "truncated")
    before = {p.name: p.read_bytes() for p in (run / "ckpt").glob("*.ckpt")}
    result = run_main(
        "fit",
        "--config",
        "sft.yaml",
        "--ckpt_path",
        "last",
        "--trainer.max_steps",
        "5",
        "--model.init_args.export_existing",
        "replace",
        cwd=run,
    )
    assert result.returncode == 1
    line = error_line(result)
    assert line.startswith("rlhf-lit: error: --ckpt_path last (") and "last.ckpt): cut short (" in line, line
    assert f"{step4.name}: resume from it with `" in line
    command = shlex.split(line.split("`")[1])
    assert command[:2] == ["rlhf-lit", "fit"] and command[-2] == "--ckpt_path" and command[-1].endswith(step4.name)
    assert {p.name: p.read_bytes() for p in (run / "ckpt").glob("*.ckpt")} == before  # nothing written


# ------------------------------------------------------------------------------------ a full disk


def test_a_disk_full_during_a_checkpoint_keeps_the_earlier_checkpoints_and_the_export(sft_run, tmp_path, monkeypatch):
    # The disk fills up half way through the next checkpoint: the write fails as a full disk fails it.
    import lightning.fabric.plugins.io.torch_io as torch_io

    run = _run_copy(sft_run, tmp_path)
    before = {p.name: p.read_bytes() for p in (run / "ckpt").glob("*.ckpt")}
    export = (run / "export" / "model.safetensors").read_bytes()

    def full_disk(checkpoint, path) -> None:
        with open(path, "wb") as f:
            f.write(b"PK\x03\x04" + b"\0" * 100)  # what fitted before the disk was full
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(torch_io, "_atomic_save", full_disk)  # what TorchCheckpointIO writes with
    result = run_main(
        "fit",
        "--config",
        "sft.yaml",
        "--ckpt_path",
        "ckpt/last.ckpt",
        "--trainer.max_steps",
        "6",
        "--model.init_args.export_existing",
        "replace",
        cwd=run,
    )
    assert result.returncode == 1
    assert "No space left on device" in error_line(result)
    assert {p.name: p.read_bytes() for p in (run / "ckpt").glob("*.ckpt")} == before  # no final name was touched
    for ckpt in (run / "ckpt").glob("*.ckpt"):
        check_checkpoint(ckpt)
        assert torch.load(ckpt, map_location="cpu", weights_only=True)["global_step"] in (2, 4)
    assert (run / "export" / "model.safetensors").read_bytes() == export
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(run / "export")  # the export still loads


def test_a_cut_short_output_of_a_command_is_kept_and_named(tmp_path):
    (tmp_path / "prompts.txt").write_text("Once upon a time\n")
    out = tmp_path / "out.json"
    out.write_text('{"written_by": "rlhf-lit evaluate", "metrics": {"judge_mean"')  # a copy cut short
    result = run_main(
        "evaluate",
        "--policy",
        str(STORIES),
        "--prompts",
        "prompts.txt",
        "--out",
        "out.json",
        "--overwrite",
        cwd=tmp_path,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--out out.json: cut short (line 1, column " in result.stderr
    assert "so it cannot be told as rlhf-lit's output; it is not replaced even with --overwrite" in result.stderr
    assert out.read_text().endswith('"judge_mean"')


def test_a_disk_full_during_the_export_keeps_the_earlier_export_and_the_checkpoints(sft_run, tmp_path, monkeypatch):
    # The disk fills up while the new export's weights are written: the earlier export stays in place.
    from transformers import AutoModelForCausalLM, PreTrainedModel

    run = _run_copy(sft_run, tmp_path)
    export = (run / "export" / "model.safetensors").read_bytes()

    def full_disk(model, directory, **kwargs) -> None:
        (Path(directory) / "model.safetensors").write_bytes(b"\0" * 64)  # what fitted
        raise OSError(errno.ENOSPC, "No space left on device", str(Path(directory) / "model.safetensors"))

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full_disk)
    result = run_main(
        "fit",
        "--config",
        "sft.yaml",
        "--ckpt_path",
        "ckpt/last.ckpt",
        "--trainer.max_steps",
        "5",
        "--model.init_args.export_existing",
        "replace",
        cwd=run,
    )
    assert result.returncode == 1
    assert "No space left on device" in error_line(result)
    assert (run / "export" / "model.safetensors").read_bytes() == export
    assert not [p.name for p in run.iterdir() if p.name.startswith(".")]  # the half-written export is gone
    monkeypatch.undo()
    AutoModelForCausalLM.from_pretrained(run / "export")
    for ckpt in (run / "ckpt").glob("*.ckpt"):  # last.ckpt now holds step 5, written before the export
        check_checkpoint(ckpt)

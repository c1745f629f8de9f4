"""`--precision` of `rlhf-lit evaluate` and `rlhf-lit best-of-n`: only the sampling runs under bf16 autocast, the
KL and the reward model's scores stay float32, the default samples as before, and the result records it."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from autocast_probe import model_forwards, precisions
from cli_helpers import STORIES, error_line, run_main

import rlhf_lit.models.precision as cpu

JUDGE = "rlhf_lit.evaluation.judges:vader"
SLOW = (
    "--precision bf16-mixed on a CPU without amx_bf16 or avx512_bf16 (no instructions for it) is emulated and no "
    "faster than 32-true"
)


def prompts_file(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("Once upon a time\nTom had a big red\n")
    return path


def evaluate_args(tmp_path, stories_rm, out: str, *extra: str) -> list[str]:
    """An evaluation with every scorer: the KL to a reference (a copy of the policy: the policy itself would
    be measured against itself with no pass), the reward model and a function judge."""
    reference = tmp_path / "reference"
    if not reference.exists():
        shutil.copytree(STORIES, reference)
    return [
        "evaluate",
        "--policy",
        str(STORIES),
        "--reference",
        str(reference),
        "--reward-model",
        stories_rm,
        "--judge",
        JUDGE,
        "--prompts",
        str(prompts_file(tmp_path)),
        "--samples-per-prompt",
        "2",
        "--max-new-tokens",
        "6",
        "--batch-size",
        "2",
        "--seed",
        "5",
        "--out",
        out,
        *extra,
    ]


def best_of_n_args(tmp_path, stories_rm, out: str, *extra: str) -> list[str]:
    return [
        "best-of-n",
        "--policy",
        str(STORIES),
        "--reward-model",
        stories_rm,
        "--prompts",
        str(prompts_file(tmp_path)),
        "--n-max",
        "2",
        "--max-new-tokens",
        "6",
        "--seed",
        "5",
        "--out",
        out,
        *extra,
    ]


@pytest.fixture
def cpu_has(monkeypatch):
    """Set the CPU's flags as the one reader (``rlhf_lit.models.precision.cpu_flags``) gives them; nothing warned yet."""
    monkeypatch.setattr(cpu, "_warned", set())

    def has(*flags: str) -> None:
        monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset(flags))

    return has


@pytest.mark.parametrize("command", ["evaluate", "best-of-n"])
def test_bf16_mixed_samples_under_autocast_and_scores_in_float32(tmp_path, stories_rm, cpu_has, command):
    cpu_has("avx512f", "amx_bf16")  # a CPU with the unit: nothing to warn about
    build = evaluate_args if command == "evaluate" else best_of_n_args
    with model_forwards() as seen:
        result = run_main(*build(tmp_path, stories_rm, "out.json", "--precision", "bf16-mixed"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    ran = precisions(seen)
    assert ran["sampling"] == {torch.bfloat16}  # every decode step of generate
    assert ran["reward model"] == {None}  # the scores best-of-N picks by
    if command == "evaluate":
        assert ran["scoring"] == {None}  # the policy's and the reference's logprobs of the KL
    assert set(ran) == (
        {"sampling", "scoring", "reward model"} if command == "evaluate" else {"sampling", "reward model"}
    )
    assert json.loads((tmp_path / "out.json").read_text())["config"]["precision"] == "bf16-mixed"
    assert "no instructions for it" not in result.stderr


@pytest.mark.parametrize("command", ["evaluate", "best-of-n"])
def test_the_default_samples_in_float32_as_before(tmp_path, stories_rm, cpu_has, command):
    # The default and an explicit 32-true: no forward under autocast, the same numbers, the same config but the
    # precision named; a CPU without bf16 units is no concern of a float32 run.
    cpu_has("avx2", "avx512f")
    build = evaluate_args if command == "evaluate" else best_of_n_args
    with model_forwards() as seen:
        default = run_main(*build(tmp_path, stories_rm, "default.json"), cwd=tmp_path)
    assert default.returncode == 0, default.stderr[-3000:]
    assert {dtype for _, dtype in seen} == {None} and "sampling" in precisions(seen)
    explicit = run_main(*build(tmp_path, stories_rm, "explicit.json", "--precision", "32-true"), cwd=tmp_path)
    assert explicit.returncode == 0, explicit.stderr[-3000:]
    results = [json.loads((tmp_path / name).read_text()) for name in ("default.json", "explicit.json")]
    for result in results:
        result.pop("timing_s")
        assert result["config"]["precision"] == "32-true"
    assert results[0] == results[1]
    assert "no instructions for it" not in default.stderr + explicit.stderr


def test_bf16_mixed_on_a_cpu_without_bf16_instructions_warns_once(tmp_path, stories_rm, cpu_has):
    cpu_has("avx2", "avx512f")  # neither amx_bf16 nor avx512_bf16
    args = evaluate_args(tmp_path, stories_rm, "out.json", "--precision", "bf16-mixed")
    result = run_main(*args, cwd=tmp_path)  # two batches of generate: one warning
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if "no instructions for it" in line]
    assert len(lines) == 1 and SLOW in lines[0] and lines[0].endswith("use --precision 32-true on this CPU")


@pytest.mark.parametrize("command", ["evaluate", "best-of-n"])
def test_a_precision_outside_its_choices_is_one_option_error(tmp_path, stories_rm, command):
    build = evaluate_args if command == "evaluate" else best_of_n_args
    result = run_main(*build(tmp_path, stories_rm, "out.json", "--precision", "bf16"), cwd=tmp_path)
    assert result.returncode == 2
    line = error_line(result)
    assert "argument --precision: invalid choice: 'bf16'" in line and "32-true" in line and "bf16-mixed" in line
    assert not (tmp_path / "out.json").exists()

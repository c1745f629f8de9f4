"""The chat demo's plan: where its sampling outside training runs in bf16 (a CPU that multiplies bf16
natively), and that the labeller and best-of-N are told so."""

from __future__ import annotations

from pathlib import Path

import pytest

import rlhf_lit.models.precision as precision_module
from demo.chat_plan import (
    CHAT_FULL,
    best_of_n_command,
    demo_precision,
    dpo_command,
    on_device,
    preferences_command,
    reward_model_command,
)
from demo.plan import Paths


@pytest.mark.parametrize(
    ("flags", "want"),
    [
        (frozenset({"avx512f", "amx_bf16", "amx_tile"}), "bf16-mixed"),
        (frozenset({"avx512f", "avx512_bf16"}), "bf16-mixed"),  # AVX-512 bf16 dot products, no AMX
        (frozenset({"avx512f", "amx_fp16"}), "32-true"),  # an fp16 unit does not multiply bf16
        (frozenset({"avx512f", "avx2"}), "32-true"),  # emulated bf16 is slower than float32
        (None, "32-true"),  # flags unreadable: the safe choice
    ],
)
def test_auto_samples_in_bf16_only_where_the_cpu_multiplies_bf16_natively(monkeypatch, flags, want):
    monkeypatch.setattr(precision_module, "cpu_flags", lambda: flags)
    assert demo_precision("auto") == want
    assert demo_precision("32-true") == "32-true" and demo_precision("bf16-mixed") == "bf16-mixed"


def test_every_stage_but_ppo_runs_at_the_precision_chosen(tmp_path):
    paths = Paths(Path(tmp_path))
    for command in (
        preferences_command("m", paths, CHAT_FULL, "j:f", None, "bf16-mixed"),
        best_of_n_command("m", paths, CHAT_FULL, "j:f", None, "bf16-mixed"),
    ):
        assert command[command.index("--precision") + 1] == "bf16-mixed"
    for command in (
        reward_model_command("m", paths, CHAT_FULL, None, "bf16-mixed"),
        dpo_command("m", paths, CHAT_FULL, 0.1, None, "bf16-mixed"),
    ):
        assert command[command.index("--trainer.precision") + 1] == "bf16-mixed"


def test_on_device_moves_fits_to_the_gpu_and_gives_the_samplers_their_device(tmp_path):
    paths = Paths(Path(tmp_path))
    fit = reward_model_command("m", paths, CHAT_FULL, None, "bf16-mixed")
    sampler = best_of_n_command("m", paths, CHAT_FULL, "j:f", None, "bf16-mixed")
    labeller = preferences_command("m", paths, CHAT_FULL, "j:f", None, "bf16-mixed")
    assert on_device(fit, "cuda")[-2:] == ["--trainer.accelerator", "gpu"]
    assert on_device(fit, "cpu")[-2:] == ["--trainer.accelerator", "cpu"]
    for command in (sampler, labeller):
        assert on_device(command, "cuda")[-2:] == ["--device", "cuda"]
        assert "--trainer.accelerator" not in on_device(command, "cuda")
    with pytest.raises(ValueError, match="device must be one of"):
        on_device(fit, "tpu")


@pytest.mark.parametrize("bf16", [True, False])
def test_auto_precision_on_a_gpu_asks_the_gpu(monkeypatch, bf16):
    import torch

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: bf16)
    monkeypatch.setattr(precision_module, "cpu_flags", lambda: frozenset({"avx512_bf16"}))
    assert demo_precision("auto", "cuda") == ("bf16-mixed" if bf16 else "32-true")
    assert demo_precision("32-true", "cuda") == "32-true"


def test_the_pipeline_refuses_cuda_where_torch_sees_no_gpu(monkeypatch, tmp_path, capsys):
    import torch

    from demo.chat_pipeline import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as stop:
        main(["--device", "cuda", "--out", str(tmp_path / "out")])
    assert stop.value.code == 2
    assert "--device cuda: torch sees no GPU" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before anything is written

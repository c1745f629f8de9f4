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

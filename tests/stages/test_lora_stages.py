"""SFT and RM with LoRA and gradient checkpointing: only adapters (and the RM head) train; the
16-bit-on-CPU precision warning."""

from __future__ import annotations

import logging

import lightning.pytorch as pl
import pytest
import torch

from rlhf_lit.models.lora import LoRAConfig
from rlhf_lit.stages import RewardModelModule, SFTModule
from rlhf_lit.stages.optim import OptimizerConfig


def _frozen_snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}


def test_sft_with_lora_and_checkpointing_trains_only_adapters(stories_path, helpers, tmp_path):
    module = SFTModule(
        stories_path,
        optimizer=OptimizerConfig(lr=3e-3),
        lora=LoRAConfig(r=4),
        gradient_checkpointing=True,
        export_dir=str(tmp_path / "export"),
    )
    frozen = _frozen_snapshot(module.model)
    assert frozen and all("lora_" not in n for n in frozen)
    batch = helpers.sft_batch(module.tokenizer, [("Tom went", " to the park."), ("Lily", " sang a song.")])
    trainer = helpers.cpu_trainer(tmp_path, max_steps=3)
    trainer.fit(module, datamodule=helpers.BatchListDataModule(train=[batch], val=[batch]))
    for name, p in module.model.named_parameters():
        if name in frozen:
            assert torch.equal(p, frozen[name]), name
    assert any(p.abs().max() > 0 for n, p in module.model.named_parameters() if "lora_B" in n)
    assert module.model.model.layers[0].gradient_checkpointing


def test_reward_model_with_lora_trains_adapters_and_head_and_exports_merged(stories_path, helpers, tmp_path):
    torch.manual_seed(0)
    module = RewardModelModule(
        stories_path,
        optimizer=OptimizerConfig(lr=1e-3, schedule="constant"),
        normalize="none",
        lora=LoRAConfig(r=4),
        export_dir=str(tmp_path / "export"),
    )
    frozen = _frozen_snapshot(module.model)
    head = module.model.score.weight.detach().clone()
    pairs = [helpers.preference_batch(module.tokenizer, [("Tom went out.", " He was happy.", " He was sad.")])]
    helpers.cpu_trainer(tmp_path, max_steps=3).fit(
        module, datamodule=helpers.BatchListDataModule(train=pairs, val=pairs)
    )
    for name, p in module.model.named_parameters():
        if name in frozen:
            assert torch.equal(p, frozen[name]), name
    assert not torch.equal(module.model.score.weight, head)
    from transformers import AutoModelForSequenceClassification

    exported = AutoModelForSequenceClassification.from_pretrained(tmp_path / "export", num_labels=1)
    assert not any("lora" in k for k in exported.state_dict())


def test_reward_model_refuses_an_adapter_export(stories_path):
    with pytest.raises(ValueError, match="lora.export: the reward model exports merged weights only"):
        RewardModelModule(stories_path, lora=LoRAConfig(export="adapter"))


def test_bf16_on_cpu_warns_once_in_one_line(stories_path, helpers, tmp_path, caplog, monkeypatch):
    import rlhf_lit.models.precision as cpu
    import rlhf_lit.stages.amp as precision

    monkeypatch.setattr(cpu, "_warned", set())
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))  # no amx_bf16 nor avx512_bf16
    module = SFTModule(stories_path, export_dir=str(tmp_path / "export"))
    batch = helpers.sft_batch(module.tokenizer, [("Tom went", " to the park.")])
    with caplog.at_level(logging.WARNING, logger="rlhf_lit"):
        helpers.cpu_trainer(tmp_path, max_steps=1, precision="bf16-mixed").fit(
            module, datamodule=helpers.BatchListDataModule(train=[batch], val=[batch])
        )
        precision.warn_if_slow_precision(module.trainer)  # a second call says nothing
    lines = [r.getMessage() for r in caplog.records if "no faster than 32-true" in r.getMessage()]
    assert (
        len(lines) == 1 and "\n" not in lines[0] and "bf16-mixed on a CPU without amx_bf16 or avx512_bf16" in lines[0]
    )


def test_bf16_on_a_cpu_with_bf16_instructions_says_nothing(monkeypatch, caplog, tmp_path):
    import rlhf_lit.models.precision as cpu
    import rlhf_lit.stages.amp as precision

    monkeypatch.setattr(cpu, "_warned", set())
    trainer = pl.Trainer(accelerator="cpu", precision="bf16-mixed", logger=False, default_root_dir=tmp_path)
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx512f", "amx_bf16"}))
    with caplog.at_level(logging.WARNING, logger="rlhf_lit"):
        precision.warn_if_slow_precision(trainer)
    assert not [r for r in caplog.records if "32-true" in r.getMessage()] and not cpu._warned
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))  # AVX-512 bf16, no AMX
    with caplog.at_level(logging.WARNING, logger="rlhf_lit"):
        precision.warn_if_slow_precision(trainer)
    assert not [r for r in caplog.records if "32-true" in r.getMessage()] and not cpu._warned
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx512f"}))
    with caplog.at_level(logging.WARNING, logger="rlhf_lit"):
        precision.warn_if_slow_precision(trainer)
    assert [r for r in caplog.records if "without amx_bf16" in r.getMessage()]


def test_cpu_flags_are_read_from_the_flags_line(tmp_path):
    from rlhf_lit.models.precision import cpu_flags

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 amx_bf16\nbugs\t\t: spectre\n")
    assert cpu_flags(str(info)) == frozenset({"fpu", "avx2", "amx_bf16"})
    assert cpu_flags(str(tmp_path / "missing")) is None


def test_the_shared_stage_settings_are_kept_with_their_defaults_and_lora_as_a_dict(stories_path):
    # Written out by hand: the PretrainedStage arguments (defaults unless given) and how hparams keep them.
    module = SFTModule(stories_path, lora=LoRAConfig(r=4), max_skipped_updates=5)
    expected = {
        "tokenizer": None,
        "missing_pad": "add",
        "dtype": "float32",
        "export_dir": None,
        "export_existing": "refuse",
        "max_skipped_updates": 5,
        "revision": None,
        "trust_remote_code": False,
        "lora": {"r": 4, "alpha": 16.0, "dropout": 0.0, "target_modules": None, "export": "merged"},
        "gradient_checkpointing": False,
    }
    assert {name: module.hparams[name] for name in expected} == expected
    assert module.hparams["model"] == stories_path

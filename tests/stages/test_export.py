"""Hugging Face export helpers, and the GPT-2 code path (pad added, embeddings resized) end to end."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlhf_lit.models import load_causal_lm
from rlhf_lit.stages import SFTModule
from rlhf_lit.stages.export import MARKER, default_export_dir, export_at_fit_end, save_pretrained_atomically
from rlhf_lit.stages.nonfinite import NonFiniteError
from rlhf_lit.stages.optim import OptimizerConfig


class _FakeSaver(torch.nn.Module):
    """Stands in for a model or tokenizer: writes one file, or fails half way; ``value`` is its one weight."""

    def __init__(self, name: str, fail: bool = False, value: float = 1.0) -> None:
        super().__init__()
        self.name, self.fail = name, fail
        self.weight = torch.nn.Parameter(torch.tensor([value]))

    def save_pretrained(self, path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        (path / self.name).write_text("new")
        if self.fail:
            raise RuntimeError("disk full")


def _earlier_export(target) -> None:
    save_pretrained_atomically(_FakeSaver("weights"), _FakeSaver("tokenizer.json"), target, "SFT model")
    (target / "weights").write_text("old")


def test_an_export_carries_the_marker_and_replaces_an_earlier_one_only_when_asked(tmp_path):
    target = tmp_path / "out" / "model"
    _earlier_export(target)
    assert json.loads((target / MARKER).read_text())["what"] == "SFT model"
    with pytest.raises(
        ValueError, match="holds an earlier rlhf-lit export .SFT model, written .*export_existing: replace"
    ):
        save_pretrained_atomically(_FakeSaver("weights"), _FakeSaver("tokenizer.json"), target)
    assert (target / "weights").read_text() == "old"
    path = save_pretrained_atomically(_FakeSaver("weights"), _FakeSaver("tokenizer.json"), target, existing="replace")
    assert path == target.absolute() and (target / "weights").read_text() == "new"
    assert sorted(p.name for p in target.iterdir()) == sorted([MARKER, "tokenizer.json", "weights"])
    assert [p.name for p in target.parent.iterdir()] == ["model"]  # no .tmp- / .old- left


def test_an_earlier_export_whose_marker_is_damaged_is_refused_naming_the_marker(tmp_path):
    target = tmp_path / "model"
    _earlier_export(target)
    (target / MARKER).write_text('{"what": "SFT mo')  # a crash or a copy cut short
    with pytest.raises(
        ValueError, match=f"its marker is damaged: {target / MARKER}: cut short .*export_existing: replace"
    ):
        save_pretrained_atomically(_FakeSaver("weights"), _FakeSaver("tokenizer.json"), target)
    assert (target / "weights").read_text() == "old"


@pytest.mark.parametrize("existing", ["refuse", "replace"])
def test_a_directory_rlhf_lit_did_not_write_is_never_replaced(tmp_path, existing):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "thesis.tex").write_text("years of work")
    with pytest.raises(ValueError, match="not empty and was not written by rlhf-lit"):
        save_pretrained_atomically(_FakeSaver("weights"), _FakeSaver("tokenizer.json"), target, existing=existing)
    assert [p.name for p in target.iterdir()] == ["thesis.tex"]
    assert [p.name for p in tmp_path.iterdir()] == ["mine"]
    (tmp_path / "empty").mkdir()  # an empty directory is fine
    save_pretrained_atomically(_FakeSaver("weights"), _FakeSaver("tokenizer.json"), tmp_path / "empty")


def test_failed_save_leaves_the_previous_export_intact(tmp_path):
    target = tmp_path / "model"
    _earlier_export(target)
    with pytest.raises(RuntimeError, match="disk full"):
        save_pretrained_atomically(
            _FakeSaver("weights"), _FakeSaver("tokenizer.json", fail=True), target, existing="replace"
        )
    assert (target / "weights").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_non_finite_weights_are_never_exported(tmp_path):
    with pytest.raises(NonFiniteError, match="non-finite weights .weight"):
        save_pretrained_atomically(_FakeSaver("weights", value=float("nan")), _FakeSaver("t"), tmp_path / "m")
    assert list(tmp_path.iterdir()) == []


def test_default_export_dir_follows_the_log_dir(tmp_path, helpers):
    assert default_export_dir(helpers.cpu_trainer(tmp_path, max_steps=1)) == str(tmp_path / "model")
    logger = TensorBoardLogger(str(tmp_path), name="rm", version=3)
    trainer = helpers.cpu_trainer(tmp_path, max_steps=1, logger=logger)
    assert default_export_dir(trainer) == str(tmp_path / "rm" / "version_3" / "model")


class _FakeStrategy:
    """Records barrier calls: every rank must reach the barrier after the export."""

    def __init__(self) -> None:
        self.barriers: list[str] = []

    def barrier(self, name: str) -> None:
        self.barriers.append(name)


def _fake_trainer(tmp_path, is_global_zero: bool) -> SimpleNamespace:
    return SimpleNamespace(
        is_global_zero=is_global_zero, log_dir=None, default_root_dir=str(tmp_path), strategy=_FakeStrategy()
    )


def test_only_rank_zero_exports_and_it_prints_the_path(tmp_path, capsys):
    other_rank = _fake_trainer(tmp_path, is_global_zero=False)
    assert export_at_fit_end(other_rank, _FakeSaver("w"), _FakeSaver("t"), None, "SFT model") is None
    assert list(tmp_path.iterdir()) == []
    assert other_rank.strategy.barriers == ["rlhf_lit_export"]  # waits for rank 0's files
    rank_zero = _fake_trainer(tmp_path, is_global_zero=True)
    path = export_at_fit_end(rank_zero, _FakeSaver("w"), _FakeSaver("t"), None, "SFT model")
    assert path == (tmp_path / "model").absolute()
    assert capsys.readouterr().out == f"[rlhf-lit] exported SFT model to {path}\n"
    assert rank_zero.strategy.barriers == ["rlhf_lit_export"]


def test_gpt2_sft_adds_pad_resizes_and_reloads(gpt2_dir, helpers, tmp_path):
    torch.manual_seed(0)
    module = SFTModule(gpt2_dir, optimizer=OptimizerConfig(lr=1e-3), export_dir=str(tmp_path / "sft"))
    tok = module.tokenizer
    assert tok.pad_token == "<|pad|>" and tok.pad_token_id == 50257 and tok.eos_token_id == 50256
    assert module.model.get_input_embeddings().num_embeddings == 50258
    assert module.model.config.pad_token_id == 50257
    batch = helpers.sft_batch(tok, [("The cat", " sat on the mat."), ("Hi", " there!")])
    assert batch["input_ids"][1, -1] == 50257  # row 1 is padded with the new token
    before = {k: v.clone() for k, v in module.model.state_dict().items()}
    helpers.cpu_trainer(tmp_path, max_steps=2).fit(module, datamodule=helpers.BatchListDataModule(train=[batch]))
    assert not torch.equal(
        before["transformer.h.0.attn.c_attn.weight"], module.model.state_dict()["transformer.h.0.attn.c_attn.weight"]
    )

    assert module.exported_path == (tmp_path / "sft").absolute()
    exported = AutoModelForCausalLM.from_pretrained(module.exported_path)
    reloaded_tok = AutoTokenizer.from_pretrained(module.exported_path)
    assert reloaded_tok.pad_token == "<|pad|>" and reloaded_tok.pad_token_id == 50257 and len(reloaded_tok) == 50258
    assert exported.get_input_embeddings().num_embeddings == 50258 and exported.config.pad_token_id == 50257
    with torch.no_grad():
        expected = module.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        got = exported(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    # rlhf-lit runs GPT-2's tanh-GELU as one fused kernel (models/kernels.py), plain transformers op by
    # op: the same function up to float32 rounding. Loaded by rlhf-lit, the export is bit-identical.
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))
    with torch.no_grad():
        ours = load_causal_lm(str(module.exported_path))(
            **{k: batch[k] for k in ("input_ids", "attention_mask")}
        ).logits
    assert torch.equal(ours, expected)


def test_a_directory_that_changes_after_the_check_is_put_back_untouched(tmp_path, monkeypatch):
    # Second line of defence: even if the target changed between the check and the swap (here the
    # check is skipped), a directory without the marker is moved back, never deleted.
    import rlhf_lit.stages.export as export

    target = tmp_path / "mine"
    target.mkdir()
    (target / "thesis.tex").write_text("years of work")
    monkeypatch.setattr(export, "check_export_target", lambda path, existing: None)
    with pytest.raises(ValueError, match="changed while the export was written"):
        save_pretrained_atomically(_FakeSaver("weights"), _FakeSaver("tokenizer.json"), target, existing="replace")
    assert [p.name for p in target.iterdir()] == ["thesis.tex"] and (
        target / "thesis.tex"
    ).read_text() == "years of work"
    assert [p.name for p in tmp_path.iterdir()] == ["mine"]  # nothing left beside it

"""Reward-model checkpoints of the released format load and resume, and score as they did.

The checkpoints (a plain RM, a 2-member ensemble, an ODIN RM; tests/stages/reward_checkpoints/, 0.8 MB
in all) and the scores the code that wrote them computed (``expected.json``) were made by
``reward_checkpoint_fixtures.py``, whose docstring says how. Nothing here recomputes an expected value
with the code under test: every number comes from the file.
"""

from __future__ import annotations

import json

import pytest
import reward_checkpoint_fixtures as fixtures
import torch
from assets_paths import ROOT
from torch.testing import assert_close

from rlhf_lit.models import sequence_scores
from rlhf_lit.stages import RewardModelModule

EXPECTED = json.loads((ROOT / fixtures.FIXTURES / "expected.json").read_text(encoding="utf-8"))


@pytest.fixture(autouse=True)
def at_the_checkout_root(monkeypatch):
    """The checkpoints name their start model relative to the checkout's root, as a run started there would."""
    monkeypatch.chdir(ROOT)


@pytest.mark.parametrize("kind", list(fixtures.KINDS))
def test_a_released_checkpoint_loads_with_its_keys_weights_and_scores(kind):
    path = fixtures.FIXTURES / f"{kind}.fixture.pt"
    saved = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    module = RewardModelModule.load_from_checkpoint(path, weights_only=True)
    state = module.state_dict()
    assert list(state) == list(saved)  # the same names, in the same order
    for key, value in saved.items():
        assert torch.equal(state[key], value), key
    expected = EXPECTED[kind]["at_checkpoint"]
    ids, mask = fixtures.probe_batch(module.tokenizer)
    with torch.no_grad():
        assert_close(module.raw_scores(ids, mask), torch.tensor(expected["raw"]), rtol=0, atol=1e-5)
        assert_close(module(ids, mask), torch.tensor(expected["normalised"]), rtol=0, atol=1e-5)
        if "heads" in expected:  # ODIN's two rows, quality first: raw_scores is the quality row
            assert_close(sequence_scores(module.model, ids, mask), torch.tensor(expected["heads"]), rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", list(fixtures.KINDS))
def test_a_released_checkpoint_resumes_and_takes_the_step_it_took(kind, tmp_path):
    """``--ckpt_path``: the optimizer states, the step counter and the loss of the last step are the
    ones the earlier code had; the fit then normalises, folds and exports as it did."""
    module = fixtures.module(kind, tmp_path)
    trainer = fixtures.trainer(tmp_path)
    trainer.fit(
        module, datamodule=fixtures.FixtureData(module.tokenizer), ckpt_path=fixtures.FIXTURES / f"{kind}.fixture.pt"
    )
    assert trainer.global_step == fixtures.MAX_STEPS
    expected = EXPECTED[kind]["resumed"]
    logged = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("train/")}
    assert logged == pytest.approx(expected["logged"], rel=1e-5, abs=1e-6)
    ids, mask = fixtures.probe_batch(module.tokenizer)
    with torch.no_grad():
        assert_close(module(ids, mask), torch.tensor(expected["normalised"]), rtol=0, atol=1e-5)
    assert_close(module.reward_gain, torch.tensor(expected["reward_gain"]), rtol=0, atol=1e-6)
    assert_close(module.reward_bias, torch.tensor(expected["reward_bias"]), rtol=0, atol=1e-5)
    assert (tmp_path / kind).is_dir()  # exported

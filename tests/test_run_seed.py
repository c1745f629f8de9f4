"""Seed options left unset take the run's seed (``seed_everything``, kept by Lightning in ``PL_GLOBAL_SEED``)."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
from assets_paths import TINYSTORIES

from rlhf_lit.data import PromptDataModule, SFTDataModule
from rlhf_lit.run_seed import SEED_ENV, run_seed, seed_or_run_seed


def test_an_unset_seed_is_the_run_seed_and_a_set_one_is_kept(monkeypatch):
    monkeypatch.delenv(SEED_ENV, raising=False)
    assert (run_seed(), seed_or_run_seed(None), seed_or_run_seed(5)) == (None, 0, 5)  # not seeded: 0
    monkeypatch.setenv(SEED_ENV, "0")  # restored by monkeypatch, with what seed_everything sets below
    monkeypatch.setenv("PL_SEED_WORKERS", "0")
    pl.seed_everything(42)  # what LightningCLI does with --seed_everything 42
    assert (run_seed(), seed_or_run_seed(None), seed_or_run_seed(5), seed_or_run_seed(0)) == (42, 42, 5, 0)


@pytest.mark.parametrize("module", [SFTDataModule, PromptDataModule])
def test_a_data_module_without_a_seed_orders_its_data_by_the_run_seed(monkeypatch, module):
    monkeypatch.setenv(SEED_ENV, "42")
    unset = module(train_path=str(TINYSTORIES), format="paragraphs")
    assert unset.seed == 42 and unset.hparams["seed"] is None  # the option as given stays in the config
    assert module(train_path=str(TINYSTORIES), format="paragraphs", seed=3).seed == 3

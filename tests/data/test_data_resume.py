"""The training order of SFT, RM and DPO: the order they always had, now resumable mid-epoch.

The reference for the order is the loader these modules used before their position was saved: a
``DataLoader(shuffle=True, generator=torch.Generator().manual_seed(seed))``, as Lightning's
training loop iterated it epoch after epoch. A resume from any checkpoint, in the middle of an
epoch or at its end, sees exactly the batches an uninterrupted run sees after that point.
"""

import glob
import logging
import warnings

import lightning as L
import pytest
import torch
from data_assets import HH, TINYSTORIES
from torch.utils.data import DataLoader

from rlhf_lit.data import PreferenceDataModule, ResumableSampler, SFTDataModule
from rlhf_lit.data.sampler import dataloader_order
from rlhf_lit.stages.pretrained import PretrainedStage


class _Recorder(L.LightningModule):
    """Trains on the integers of ``old_loader`` (the loader SFT, RM and DPO had) and records them."""

    def __init__(self, old_loader: DataLoader):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))
        self.old_loader, self.seen = old_loader, []

    def train_dataloader(self):
        return self.old_loader

    def training_step(self, batch, batch_idx):
        self.seen.extend(batch.tolist())
        return (self.w**2).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize(("size", "batch_size"), [(5, 2), (8, 4), (7, 7)])
def test_dataloader_order_is_what_lightning_took_from_a_seeded_shuffling_dataloader(size, batch_size, tmp_path):
    # (8, 4): the last batch is full, Lightning reads no further and RandomSampler's trailing draw never happens
    old_loader = DataLoader(
        torch.arange(size), batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(11)
    )
    recorder = _Recorder(old_loader)
    L.Trainer(
        max_epochs=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        default_root_dir=tmp_path,
    ).fit(recorder)
    assert recorder.seen == sum((dataloader_order(size, 11, epoch, batch_size) for epoch in range(3)), [])
    assert sorted(dataloader_order(size, 11, 2, batch_size)) == list(range(size))


def test_a_module_position_loaded_before_setup_is_applied_in_setup(stories_tok):
    def data():
        return SFTDataModule(
            tokenizer=stories_tok,
            train_path=str(TINYSTORIES),
            format="paragraphs",
            max_records=10,
            batch_size=4,
            max_length=32,
            max_prompt_length=8,
        )

    dm = data()
    dm.setup()
    first = [b["input_ids"].tolist() for b in dm.train_dataloader()]
    dm.mark_consumed(4)
    state = dm.state_dict()
    assert state == {"sampler": {"epoch": 0, "consumed": 4, "dataset_size": 10, "shuffle": True, "seed": 0}}
    fresh = data()
    fresh.load_state_dict(state)  # Lightning may restore before setup
    fresh.setup()
    assert [b["input_ids"].tolist() for b in fresh.train_dataloader()] == first[1:]
    assert isinstance(fresh.sampler, ResumableSampler)


class _Messages(logging.Handler):
    """Collects the messages of the logger it is added to (not caplog: the CLI's logging setup and
    other tests' handlers decide what reaches the root logger)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_a_checkpoint_without_a_data_position_says_the_epoch_restarts(stories_tok):
    dm = SFTDataModule(
        tokenizer=stories_tok,
        train_path=str(TINYSTORIES),
        format="paragraphs",
        max_records=10,
        batch_size=4,
        max_length=32,
        max_prompt_length=8,
    )
    logger, said = logging.getLogger("rlhf_lit.data"), _Messages()
    logger.addHandler(said)
    try:
        dm.load_state_dict({})  # what an SFT checkpoint of an older rlhf-lit holds
        assert said.messages == [
            "the checkpoint holds no data position (written by an older rlhf-lit): a resume in the middle of an "
            "epoch starts that epoch's data from its first batch"
        ]
        said.messages.clear()
        dm.load_state_dict({"sampler": {"epoch": 0, "consumed": 4, "dataset_size": 10, "shuffle": True, "seed": 0}})
        assert said.messages == []
    finally:
        logger.removeHandler(said)


class _Trainee(L.LightningModule):
    """Records the batches it trains on; reports them consumed with the stages' own hook."""

    on_train_batch_start = PretrainedStage.on_train_batch_start  # what SFT, RM and DPO run

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))
        self.seen: list[list[list[int]]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(next(iter(batch.values()))[:, :6].tolist())
        return (self.w**2).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _sft(tok):
    # 18 examples in batches of 4: 5 batches an epoch, the last one of 2
    return SFTDataModule(
        tokenizer=tok,
        train_path=str(TINYSTORIES),
        format="paragraphs",
        max_records=18,
        batch_size=4,
        max_length=32,
        max_prompt_length=8,
        seed=3,
    )


def _pairs(tok):
    return PreferenceDataModule(
        tokenizer=tok,
        train_path=str(HH),
        format="hh_rlhf",
        max_records=10,
        batch_size=4,
        max_length=64,
        max_prompt_length=32,
        seed=3,
    )


@pytest.mark.parametrize("make_data", [_sft, _pairs], ids=["sft", "preference"])
def test_a_resume_mid_epoch_or_at_its_end_sees_exactly_the_batches_left(stories_tok, tmp_path, make_data):
    def trainer(**kw):
        return L.Trainer(
            max_epochs=3,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accelerator="cpu",
            default_root_dir=tmp_path,
            **kw,
        )

    every_step = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1)
    straight = _Trainee()
    trainer(callbacks=[every_step]).fit(straight, datamodule=make_data(stories_tok))
    per_epoch = len(straight.seen) // 3
    # mid-epoch 0, the end of epoch 0, mid-epoch 1
    for step in (2, per_epoch, per_epoch + 1):
        resumed = _Trainee()
        (checkpoint,) = glob.glob(str(tmp_path / f"*-step={step}.ckpt"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer(enable_checkpointing=False).fit(resumed, datamodule=make_data(stories_tok), ckpt_path=checkpoint)
        assert resumed.seen == straight.seen[step:], step
        # the loader is known to be resumable: Lightning does not call the resume unreliable
        assert not [w for w in caught if "dataloader is not resumable" in str(w.message)]

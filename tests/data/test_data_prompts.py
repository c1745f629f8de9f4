"""Prompt data for PPO: left padding, index, and exactly resumable sampling."""

import lightning as L
import pytest
import torch
from data_assets import HH, TINYSTORIES, write_jsonl

from rlhf_lit.data import PromptDataModule, ResumableSampler

# stories260K ids: "Once upon a time there was a cat" -> 1 | 403 407 261 378 383 286 261 280 294;
# "Hi" -> 1 | 320 417; pad 0
PROMPTS = [{"prompt": "Hi"}, {"prompt": "Once upon a time there was a cat"}]


def test_left_padded_with_index_and_left_truncation(stories_tok, tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", PROMPTS)
    dm = PromptDataModule(tokenizer=stories_tok, train_path=path, val_path=path, max_prompt_length=6, batch_size=2)
    dm.setup("fit")
    batch = next(iter(dm.val_dataloader()))
    # the second prompt is cut from the LEFT to 6 tokens with its BOS kept in front:
    # [1] + the last 5 of 403 407 261 378 383 286 261 280 294 ("there was a cat")
    assert batch["input_ids"].tolist() == [[0, 0, 0, 1, 320, 417], [1, 383, 286, 261, 280, 294]]
    assert batch["attention_mask"].tolist() == [[0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]]
    assert batch["index"].tolist() == [0, 1] and batch["index"].dtype == torch.long


def test_drop_last_and_shuffle(stories_tok, tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"Hi {i}"} for i in range(5)])
    dm = PromptDataModule(tokenizer=stories_tok, train_path=path, batch_size=2, seed=7)
    dm.setup()
    indexes = [b["index"].tolist() for b in dm.train_dataloader()]
    assert [len(i) for i in indexes] == [2, 2]  # drop_last: 5 prompts give 2 full batches
    assert sum(indexes, []) == ResumableSampler(5, seed=7).order(0)[:4]
    dm = PromptDataModule(tokenizer=stories_tok, train_path=path, batch_size=2, shuffle=False, drop_last=False)
    dm.setup()
    assert [b["index"].tolist() for b in dm.train_dataloader()] == [[0, 1], [2, 3], [4]]


def test_hh_prompts_end_with_assistant_marker(stories_tok):
    dm = PromptDataModule(
        tokenizer=stories_tok, train_path=str(HH), format="hh_rlhf", max_records=16, max_prompt_length=64
    )
    dm.setup()
    marker = stories_tok("\n\nAssistant:", add_special_tokens=False)["input_ids"][1:]  # drop the lone "▁"
    assert all(x["input_ids"][-len(marker) :] == marker for x in dm.train_dataset)


def test_sampler_deterministic_per_epoch():
    a, b = ResumableSampler(10, seed=3), ResumableSampler(10, seed=3)
    assert list(a) == list(b) and sorted(a) == list(range(10))
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first and sorted(a) == list(range(10))
    assert list(ResumableSampler(4, shuffle=False)) == [0, 1, 2, 3]


def test_sampler_resume_continues_with_the_same_remaining_order():
    s = ResumableSampler(10, seed=5)
    s.set_epoch(2)
    full = list(s)
    s.mark_consumed(4)  # the consumer used 4 (the loader may have prefetched more)
    state = s.state_dict()
    assert state == {"epoch": 2, "consumed": 4, "dataset_size": 10, "shuffle": True, "seed": 5}

    resumed = ResumableSampler(10, seed=5)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)  # Lightning calls this at the start of the resumed epoch: count kept
    assert list(resumed) == full[4:]
    assert len(resumed) == 10  # the loader's length stays the full epoch
    resumed.set_epoch(3)  # a new epoch starts from its beginning
    assert list(resumed) == ResumableSampler(10, seed=5).order(3)

    with pytest.raises(ValueError, match="checkpoint has seed=5 but this run has seed=6"):
        ResumableSampler(10, seed=6).load_state_dict(state)
    with pytest.raises(ValueError, match="cannot mark 7 more samples consumed"):
        s.mark_consumed(7)


def test_sampler_sharded_over_ranks_resumes_exactly_with_a_global_count():
    order = ResumableSampler(11, seed=1).order(0)
    ranks = [ResumableSampler(11, seed=1, num_replicas=2, rank=r) for r in (0, 1)]
    # every 2nd sample of the order from each rank's offset; the odd one left over is dropped
    assert [list(s) for s in ranks] == [order[0:10:2], order[1:10:2]]
    assert [len(s) for s in ranks] == [5, 5]
    # one step of batch 2 on both ranks used order[:4] (a contiguous block): report 4 on every rank
    for s in ranks:
        s.mark_consumed(4)
    state = ranks[0].state_dict()
    assert state == ranks[1].state_dict()
    # resume on one rank: exactly the rest of the order
    single = ResumableSampler(11, seed=1)
    single.load_state_dict(state)
    assert list(single) == order[4:]


def test_module_state_dict_before_and_after_setup(stories_tok, tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"Hi {i}"} for i in range(6)])
    dm = PromptDataModule(tokenizer=stories_tok, train_path=path, batch_size=2)
    dm.setup()
    order = [b["index"].tolist() for b in dm.train_dataloader()]
    dm.mark_consumed(2)
    state = dm.state_dict()

    fresh = PromptDataModule(tokenizer=stories_tok, train_path=path, batch_size=2)
    fresh.load_state_dict(state)  # Lightning may restore before setup: applied in setup
    assert fresh.state_dict() == state
    fresh.setup()
    assert [b["index"].tolist() for b in fresh.train_dataloader()] == order[1:]


class _Consumer(L.LightningModule):
    """Stands in for the PPO stage: records the prompts it sees and reports them consumed."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[list[int]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch["index"].tolist())
        self.trainer.datamodule.mark_consumed(len(batch["index"]))
        return (self.w**2).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_lightning_checkpoint_resume_is_exact(stories_tok, tmp_path):
    def data():
        return PromptDataModule(
            tokenizer=stories_tok,
            train_path=str(TINYSTORIES),
            format="paragraphs",
            max_records=20,
            batch_size=4,
            max_prompt_length=8,
        )

    def trainer(**kw):
        return L.Trainer(
            max_epochs=2,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accelerator="cpu",
            default_root_dir=tmp_path,
            **kw,
        )

    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1)
    full = _Consumer()
    trainer(callbacks=[ckpt]).fit(full, datamodule=data())
    assert len(full.seen) == 10  # 2 epochs x 5 batches of 4

    resumed = _Consumer()
    trainer(enable_checkpointing=False).fit(resumed, datamodule=data(), ckpt_path=str(tmp_path / "epoch=0-step=3.ckpt"))
    assert resumed.seen == full.seen[3:]  # the rest of epoch 0, then all of epoch 1

"""The PPO-ptx source of PromptDataModule: SFT batches, a new seeded order per pass, sharding,
and the PPO stage drawing from it."""

import sys
from pathlib import Path

import pytest
import torch
from data_assets import STORIES260K, TINYSTORIES, write_jsonl

from rlhf_lit.data import PassSampler, PromptDataModule, SFTDataModule

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ppo"))
from ppo_helpers import RecordingLogger  # noqa: E402

# stories260K ids: "Once upon a" -> 1 | 403 407 261; " time there was a cat" -> 378 383 286 261 280
# 294; "Hi" -> 1 | 320 417; " there" -> 383; " there was a cat" -> 383 286 261 280 294; EOS 2, pad 0
DEMOS = [
    {"prompt": "Once upon a", "response": " time there was a cat"},
    {"prompt": "Hi", "response": " there"},
    {"prompt": "Hi", "response": " there was a cat"},
]
ROWS = [  # (input_ids, labels) of DEMOS: labels -100 on the prompt, the EOS counts
    ([1, 403, 407, 261, 378, 383, 286, 261, 280, 294, 2], [-100] * 4 + [378, 383, 286, 261, 280, 294, 2]),
    ([1, 320, 417, 383, 2], [-100] * 3 + [383, 2]),
    ([1, 320, 417, 383, 286, 261, 280, 294, 2], [-100] * 3 + [383, 286, 261, 280, 294, 2]),
]


def _prompts(tmp_path):
    return write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "Hi"}, {"prompt": "Once upon a"}])


def test_ptx_batches_are_sft_batches_in_a_new_seeded_order_per_pass(stories_tok, tmp_path):
    demos = write_jsonl(tmp_path / "demos.jsonl", DEMOS)
    dm = PromptDataModule(
        tokenizer=stories_tok, train_path=_prompts(tmp_path), batch_size=2, seed=5, ptx_path=demos, ptx_batch_size=1
    )
    dm.setup("fit")
    loader = dm.ptx_dataloader()
    passes = [list(loader) for _ in range(2)]
    # pass k is torch.randperm(3) seeded with seed + k: [2, 1, 0] (seed 5), then [2, 0, 1] (seed 6)
    for batches, order in zip(passes, ([2, 1, 0], [2, 0, 1])):
        assert [(b["input_ids"][0].tolist(), b["labels"][0].tolist()) for b in batches] == [ROWS[i] for i in order]
        assert all(b["attention_mask"].tolist() == [[1] * len(ROWS[i][0])] for b, i in zip(batches, order))
    # ptx_batch_size None: the prompt batch size; padding on the right, labels -100 there
    dm = PromptDataModule(tokenizer=stories_tok, train_path=_prompts(tmp_path), batch_size=2, seed=3, ptx_path=demos)
    dm.setup()
    batch = next(iter(dm.ptx_dataloader()))  # seed 3: torch.randperm(3) = [1, 0, 2]
    assert batch["input_ids"].tolist() == [ROWS[1][0] + [0] * 6, ROWS[0][0]]
    assert batch["labels"].tolist() == [ROWS[1][1] + [-100] * 6, ROWS[0][1]]
    assert batch["attention_mask"].tolist() == [[1] * 5 + [0] * 6, [1] * 11]
    assert dm.stats["ptx_examples"] == 3 and dm.stats["train_examples"] == 2


def test_ptx_paragraphs_asset_matches_sft_data(stories_tok):
    common = dict(format="paragraphs", prompt_words=4)
    dm = PromptDataModule(
        tokenizer=stories_tok,
        train_path=str(TINYSTORIES),
        max_records=8,
        max_prompt_length=16,
        ptx_path=str(TINYSTORIES),
        ptx_format="paragraphs",
        ptx_max_records=16,
        ptx_batch_size=4,
        ptx_max_length=64,
        **common,
    )
    dm.setup()
    sft = SFTDataModule(
        tokenizer=stories_tok,
        train_path=str(TINYSTORIES),
        max_records=16,
        max_prompt_length=16,
        max_length=64,
        **common,
    )
    sft.setup()
    batches = list(dm.ptx_dataloader())
    assert [b["input_ids"].shape[0] for b in batches] == [4, 4, 4, 4] and dm.stats["ptx_records"] == 16
    rows = sorted(
        (ids[:n], labels[:n])
        for b in batches
        for ids, labels, n in zip(b["input_ids"].tolist(), b["labels"].tolist(), b["attention_mask"].sum(1).tolist())
    )
    assert rows == sorted((x["input_ids"], x["labels"]) for x in sft.train_dataset)
    for ids, labels in rows:  # the first 4 words are the prompt: BOS + their tokens are -100
        n_prompt = labels.index(next(x for x in labels if x != -100))
        assert labels[:n_prompt] == [-100] * n_prompt and ids[0] == 1 and n_prompt >= 5
        assert labels[n_prompt:] == ids[n_prompt:] and (ids[-1] == 2 or len(ids) == 64)


def test_without_ptx_path_there_is_no_ptx_dataloader_and_options_are_checked(stories_tok, tmp_path):
    dm = PromptDataModule(tokenizer=stories_tok, train_path=_prompts(tmp_path))
    assert not hasattr(dm, "ptx_dataloader")
    with pytest.raises(AttributeError, match="ptx_path is not set"):
        dm.ptx_dataloader()
    with pytest.raises(ValueError, match="ptx_batch_size=4 is set but ptx_path is not"):
        PromptDataModule(tokenizer=stories_tok, train_path="p.jsonl", ptx_batch_size=4)
    with pytest.raises(ValueError, match="ptx_max_records=3 is set but ptx_path is not"):
        PromptDataModule(tokenizer=stories_tok, train_path="p.jsonl", ptx_max_records=3)
    message = "max_prompt_length < ptx_max_length, got max_prompt_length=256, ptx_max_length=256"
    with pytest.raises(ValueError, match=message):
        PromptDataModule(tokenizer=stories_tok, train_path="p.jsonl", ptx_path="d.jsonl", ptx_max_length=256)
    # before setup: a clear error, not an empty loader
    dm = PromptDataModule(tokenizer=stories_tok, train_path=_prompts(tmp_path), ptx_path="d.jsonl")
    with pytest.raises(RuntimeError, match=r"setup\(\) has not been called"):
        dm.ptx_dataloader()


def test_pass_sampler_shards_each_pass_over_ranks():
    # torch.randperm(7) seeded 0: [4, 0, 5, 3, 2, 6, 1]; seeded 1: [0, 6, 1, 3, 5, 2, 4]
    ranks = [PassSampler(7, seed=0, num_replicas=2, rank=r) for r in (0, 1)]
    assert [list(s) for s in ranks] == [[4, 5, 2], [0, 3, 6]]  # the 7th index (1) is dropped
    assert [list(s) for s in ranks] == [[0, 1, 5], [6, 3, 2]]  # the second pass: seed 1
    assert [len(s) for s in ranks] == [3, 3]
    assert list(PassSampler(7, seed=0)) == [4, 0, 5, 3, 2, 6, 1]
    with pytest.raises(ValueError, match="2 examples cannot give each of 4 ranks one"):
        PassSampler(2, num_replicas=4, rank=0)


def _ppo_run(tmp_path, **data_kwargs):
    from lightning.pytorch import Trainer

    from rlhf_lit.models.generation import SamplingConfig
    from rlhf_lit.stages import PPOModule
    from rlhf_lit.stages.ppo.config import PPOConfig

    torch.manual_seed(0)
    module = PPOModule(
        sft_model=str(STORIES260K),
        reward_model=str(STORIES260K),
        max_rollouts=1,
        sampling=SamplingConfig(max_new_tokens=4),
        ppo=PPOConfig(epochs=1, minibatch_size=2, ptx_coef=0.5),
    )
    dm = PromptDataModule(
        tokenizer=module.tokenizer,
        train_path=str(TINYSTORIES),
        format="paragraphs",
        max_records=4,
        batch_size=2,
        max_prompt_length=16,
        **data_kwargs,
    )
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        logger=RecordingLogger(),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        max_epochs=1,
        default_root_dir=str(tmp_path),
    )
    return trainer, module, dm


def test_ppo_ptx_draws_from_the_ptx_dataloader(tmp_path):
    trainer, module, dm = _ppo_run(
        tmp_path,
        ptx_path=str(TINYSTORIES),
        ptx_format="paragraphs",
        ptx_max_records=6,
        ptx_batch_size=2,
        ptx_max_length=32,
    )
    trainer.fit(module, datamodule=dm)
    ptx_loss = trainer.logger.history[0]["loss/ptx"]
    assert ptx_loss > 0 and ptx_loss == ptx_loss  # an SFT loss was added (0.0 when ptx is off)
    # without ptx_path, PPO refuses ptx_coef > 0 before the first rollout
    trainer, module, dm = _ppo_run(tmp_path / "no_ptx")
    with pytest.raises(ValueError, match="ptx_coef > 0 needs a data module with ptx_dataloader"):
        trainer.fit(module, datamodule=dm)
    assert trainer.global_step == 0 and module.rollout_index == 0

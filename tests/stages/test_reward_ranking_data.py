"""The reward model's normalisation fallback on ranking data (``format: rankings``): the validation
split's ranking batches are pooled, every response of every prompt counted once."""

import json

import lightning.pytorch as pl
import pytest
import torch

from rlhf_lit.data import PreferenceDataModule
from rlhf_lit.models import sequence_scores
from rlhf_lit.stages import RewardModelModule

RECORDS = [
    {"prompt": "Tom had a red ball.", "responses": [" He threw it far.", " He lost it.", " It was red.", " Ball."]},
    {"prompt": "Lily went to the park", "responses": [" and played with her friends all day.", " and sat."]},
    {"prompt": "The cat was hungry.", "responses": [" It ate a fish.", " It cried.", " Meow."]},
    {"prompt": "Once upon a time", "responses": [" there was a kind girl.", " there was a dog."]},
    {"prompt": "Ben saw a bird", "responses": [" and smiled at it.", " fly.", " and ran."]},
    {"prompt": "Mia baked a cake", "responses": [" for her mom.", " badly."]},
]


def test_normalisation_falls_back_to_every_response_of_the_validation_rankings(stories_path, tmp_path):
    torch.manual_seed(0)
    module = RewardModelModule(stories_path, normalize="gain_bias")
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS), encoding="utf-8")
    dm = PreferenceDataModule(
        tokenizer=module.tokenizer, train_path=str(path), format="rankings", val_fraction=0.5, batch_size=2, seed=3
    )
    dm.setup("fit")
    assert dm.stats["val_examples"] == 3
    gain, bias = module.normalize(dm.val_dataloader(), "val")

    # Independently: each validation response scored alone, unpadded, then the population moments.
    with torch.no_grad():
        scores = torch.cat(
            [
                sequence_scores(module.model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))
                for item in dm.val_dataset
                for ids in item["input_ids"]
            ]
        ).double()
    assert len(scores) == sum(len(item["input_ids"]) for item in dm.val_dataset) > 6
    mean, std = float(scores.mean()), float(scores.std(unbiased=False))
    assert gain == pytest.approx(1 / std, rel=1e-5) and bias == pytest.approx(-mean / std, rel=1e-5)


def test_a_ranking_batch_marks_its_prompts_consumed(stories_path, tmp_path):
    # The data position counts examples (prompts), not rows: a resumed run skips exactly what was trained.
    module = RewardModelModule(stories_path, normalize="none")
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS), encoding="utf-8")
    dm = PreferenceDataModule(tokenizer=module.tokenizer, train_path=str(path), format="rankings", batch_size=4)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape[0] > 8  # 4 prompts, 2 to 4 responses each
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
    trainer.datamodule = dm
    module.trainer = trainer
    module.on_train_batch_start(batch, 0)
    assert dm.state_dict()["sampler"]["consumed"] == 4

"""The reward-normalisation reference set of PreferenceDataModule, and RewardModelModule using it."""

import pytest
import torch
from data_assets import ALPACA_V1, HH, STORIES260K, write_jsonl
from lightning.pytorch import Trainer

from rlhf_lit.data import PreferenceDataModule, SFTDataModule
from rlhf_lit.stages import RewardModelModule
from rlhf_lit.stages.optim import OptimizerConfig

# stories260K ids: "Once upon a" -> 1 | 403 407 261; " time there was a cat" -> 378 383 286 261 280
# 294; "Hi" -> 1 | 320 417; " there" -> 383; EOS 2, pad 0
DEMOS = [{"prompt": "Once upon a", "response": " time there was a cat"}, {"prompt": "Hi", "response": " there"}]
PAIRS = [{"prompt": "Hi", "chosen": " there", "rejected": " there"}]


def _pairs(tmp_path):
    return write_jsonl(tmp_path / "pairs.jsonl", PAIRS)


def test_reference_batches_are_right_padded_sft_sequences(stories_tok, tmp_path):
    demos = write_jsonl(tmp_path / "demos.jsonl", DEMOS)
    dm = PreferenceDataModule(tokenizer=stories_tok, train_path=_pairs(tmp_path), reference_path=demos, batch_size=2)
    dm.setup("fit")
    batches = list(dm.reference_dataloader())
    assert len(batches) == 1 and set(batches[0]) == {"input_ids", "attention_mask"}
    assert batches[0]["input_ids"].tolist() == [
        [1, 403, 407, 261, 378, 383, 286, 261, 280, 294, 2],
        [1, 320, 417, 383, 2, 0, 0, 0, 0, 0, 0],
    ]
    assert batches[0]["attention_mask"].tolist() == [[1] * 11, [1] * 5 + [0] * 6]
    assert dm.stats["reference_examples"] == 2 and dm.stats["train_examples"] == 1


def test_reference_uses_the_sft_truncation_rule_and_its_own_max_records(stories_tok, tmp_path):
    demos = write_jsonl(tmp_path / "demos.jsonl", DEMOS)
    dm = PreferenceDataModule(
        tokenizer=stories_tok,
        train_path=_pairs(tmp_path),
        reference_path=demos,
        reference_max_records=1,
        max_length=6,
        max_prompt_length=3,
    )
    dm.setup()
    # prompt cut from the LEFT to [1, 407, 261]; the response cut to 3 tokens, so no EOS
    assert [b["input_ids"].tolist() for b in dm.reference_dataloader()] == [[[1, 407, 261, 378, 383, 286]]]
    assert dm.stats["reference_records"] == 1
    # the same sequences SFTDataModule builds from the same demonstrations and lengths
    sft = SFTDataModule(tokenizer=stories_tok, train_path=demos, max_records=1, max_length=6, max_prompt_length=3)
    sft.setup()
    assert [x["input_ids"] for x in sft.train_dataset] == [[1, 407, 261, 378, 383, 286]]


def test_reference_from_alpaca_asset(stories_tok, tmp_path):
    dm = PreferenceDataModule(
        tokenizer=stories_tok,
        train_path=_pairs(tmp_path),
        reference_path=str(ALPACA_V1),
        reference_format="alpaca",
        reference_max_records=12,
        max_length=48,
        max_prompt_length=32,
        batch_size=4,
    )
    dm.setup()
    sft = SFTDataModule(
        tokenizer=stories_tok,
        train_path=str(ALPACA_V1),
        format="alpaca",
        max_records=12,
        max_length=48,
        max_prompt_length=32,
    )
    sft.setup()
    rows = [
        ids[:n]
        for b in dm.reference_dataloader()
        for ids, n in zip(b["input_ids"].tolist(), b["attention_mask"].sum(1).tolist())
    ]
    assert rows == [x["input_ids"] for x in sft.train_dataset]  # in file order, as SFT builds them
    assert len(rows) == dm.stats["reference_examples"] == sft.stats["train_examples"] > 0


def test_without_reference_path_there_is_no_reference_dataloader(stories_tok, tmp_path):
    dm = PreferenceDataModule(tokenizer=stories_tok, train_path=_pairs(tmp_path))
    assert not hasattr(dm, "reference_dataloader")
    with pytest.raises(AttributeError, match="reference_path is not set"):
        dm.reference_dataloader()
    with pytest.raises(ValueError, match="reference_max_records=5 is set but reference_path is not"):
        PreferenceDataModule(tokenizer=stories_tok, train_path="x.jsonl", reference_max_records=5)
    with pytest.raises(ValueError, match="reference_max_records must be >= 1"):
        PreferenceDataModule(
            tokenizer=stories_tok, train_path="x.jsonl", reference_path="r.jsonl", reference_max_records=0
        )


def _fit_rm(tmp_path, **data_kwargs):
    torch.manual_seed(0)  # the fresh score head
    module = RewardModelModule(
        str(STORIES260K),
        optimizer=OptimizerConfig(lr=1e-3, schedule="linear"),
        normalize="bias",
        export_dir=str(tmp_path / "rm"),
    )
    dm = PreferenceDataModule(
        tokenizer=module.tokenizer,
        train_path=str(HH),
        format="hh_rlhf",
        max_records=12,
        max_length=48,
        max_prompt_length=32,
        batch_size=4,
        **data_kwargs,
    )
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        max_steps=2,
        num_sanity_val_steps=0,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(module, datamodule=dm)
    return module, dm


@torch.no_grad()
def _normalised_scores(module, batches) -> torch.Tensor:
    out = []
    for b in batches:
        if "chosen_input_ids" in b:
            out += [
                module(b["chosen_input_ids"], b["chosen_attention_mask"]),
                module(b["rejected_input_ids"], b["rejected_attention_mask"]),
            ]
        else:
            out.append(module(b["input_ids"], b["attention_mask"]))
    return torch.cat(out)  # (N,)


def test_reward_model_is_normalised_to_mean_zero_on_the_reference_set(tmp_path):
    module, dm = _fit_rm(
        tmp_path, val_fraction=0.25, reference_path=str(ALPACA_V1), reference_format="alpaca", reference_max_records=10
    )
    assert module.reference_name == "PreferenceDataModule.reference_dataloader()"
    reference = _normalised_scores(module, dm.reference_dataloader())
    assert reference.shape == (dm.stats["reference_examples"],)
    assert abs(float(reference.mean())) < 1e-5
    # the validation pairs were not the reference: their mean is not 0
    assert abs(float(_normalised_scores(module, dm.val_dataloader()).mean())) > 1e-3

    # without reference_path RewardModelModule falls back to the validation pairs
    module, dm = _fit_rm(tmp_path / "fallback", val_fraction=0.25)
    assert module.reference_name == "PreferenceDataModule.val_dataloader() chosen + rejected"
    pooled = _normalised_scores(module, dm.val_dataloader())
    assert pooled.shape == (2 * dm.stats["val_examples"],)
    assert abs(float(pooled.mean())) < 1e-5

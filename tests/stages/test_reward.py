"""RewardModelModule (stories260K Llama and tiny GPT-2) and the reward normalisation fold."""

from __future__ import annotations

import random

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader
from transformers import AutoConfig, AutoModelForSequenceClassification

from rlhf_lit.models import load_reward_model, sequence_scores
from rlhf_lit.models.reward_norm import (
    NORMALIZATION_KEY,
    fold_normalization,
    gain_and_bias,
    record_normalization,
    reward_offset,
)
from rlhf_lit.stages import RewardModelModule
from rlhf_lit.stages.optim import OptimizerConfig

TEXTS = ["Once upon a time there was a cat.", "Tom ran.", "Lily saw a big red ball in the park."]


@pytest.fixture(scope="module")
def rm(stories_path) -> RewardModelModule:
    torch.manual_seed(0)
    return RewardModelModule(stories_path, normalize="none")


def _rows(tokenizer, texts=TEXTS) -> list[list[int]]:
    return [tokenizer(t).input_ids + [tokenizer.eos_token_id] for t in texts]


# ----- where the score is read ---------------------------------------------------------------------


def test_score_is_read_at_the_last_real_token(rm, helpers):
    tok = rm.tokenizer
    rows = _rows(tok)
    lengths = [len(r) for r in rows]
    assert len(set(lengths)) == 3  # three different lengths, so padding differs per row
    right_ids, right_mask = helpers.pad_rows(rows, tok.pad_token_id, "right")
    left_ids, left_mask = helpers.pad_rows(rows, tok.pad_token_id, "left")
    with torch.no_grad():
        right = rm(right_ids, right_mask)  # (3,)
        left = rm(left_ids, left_mask)  # (3,)
        # Reference: Hugging Face's own forward of each row alone (no padding: it pools the last token).
        alone = torch.stack([rm.model(input_ids=torch.tensor([r])).logits[0, 0] for r in rows])  # (3,)
    torch.testing.assert_close(right, alone, rtol=0, atol=1e-5)
    torch.testing.assert_close(left, alone, rtol=0, atol=1e-5)

    # Pad positions may hold any id: the scores do not change.
    junk = right_ids.clone()
    junk[right_mask == 0] = 77
    assert (junk != right_ids).sum() == sum(max(lengths) - n for n in lengths)
    with torch.no_grad():
        assert torch.equal(rm(junk, right_mask), right)
    # Changing the last real token (the EOS) of row 1 changes exactly that row's score.
    changed = right_ids.clone()
    changed[1, lengths[1] - 1] = 77
    with torch.no_grad():
        scores = rm(changed, right_mask)
    assert abs(float(scores[1] - right[1])) > 1e-4
    assert torch.equal(scores[[0, 2]], right[[0, 2]])


def test_chosen_and_rejected_share_one_forward(rm, helpers):
    tok = rm.tokenizer
    batch = helpers.preference_batch(
        tok, [("Tom went out.", " He was happy.", " He was sad and cried a lot."), ("Lily", " smiled.", " frowned.")]
    )
    calls = []
    hook = rm.model.model.register_forward_pre_hook(lambda m, a: calls.append("backbone"))
    with torch.no_grad():
        chosen, rejected = rm.pair_scores(batch)
    hook.remove()
    assert calls == ["backbone"]  # one pass of the trunk for both halves
    with torch.no_grad():
        chosen_alone = rm.raw_scores(batch["chosen_input_ids"], batch["chosen_attention_mask"])
        rejected_alone = rm.raw_scores(batch["rejected_input_ids"], batch["rejected_attention_mask"])
    torch.testing.assert_close(chosen, chosen_alone, rtol=0, atol=1e-6)
    torch.testing.assert_close(rejected, rejected_alone, rtol=0, atol=1e-6)

    # Chosen and rejected padded to different lengths are brought to one T; scores are unchanged.
    short = {
        k: v[:, : int(batch["chosen_attention_mask"].sum(1).max())] if k.startswith("chosen") else v
        for k, v in batch.items()
    }
    assert short["chosen_input_ids"].shape[1] < short["rejected_input_ids"].shape[1]
    with torch.no_grad():
        chosen_short, rejected_short = rm.pair_scores(short)
    torch.testing.assert_close(chosen_short, chosen, rtol=0, atol=1e-6)
    torch.testing.assert_close(rejected_short, rejected, rtol=0, atol=1e-6)


# ----- head initialisation ---------------------------------------------------------------------------


def test_fresh_head_gets_rm_init_and_trained_head_is_kept(rm, tmp_path):
    w = rm.model.score.weight  # (1, 64)
    # N(0, 1/sqrt(65)) = std 0.124; Hugging Face's own init would give 0.02. Sample std of 64 draws: +-0.011.
    assert 0.09 < float(w.detach().std()) < 0.16
    rm.model.save_pretrained(tmp_path / "rm")
    rm.tokenizer.save_pretrained(tmp_path / "rm")
    again = RewardModelModule(str(tmp_path / "rm"), normalize="none")
    assert torch.equal(again.model.score.weight, w)


# ----- learning a known rule ----------------------------------------------------------------------


def _rule_pairs(names, places, template):
    """Chosen responses say "happy", rejected ones "sad"; everything else is shared."""
    return [
        (f"{n} went to the {p}.", template.format(n=n, p=p, w="happy"), template.format(n=n, p=p, w="sad"))
        for n in names
        for p in places
    ]


def test_learns_a_known_preference_rule(stories_path, helpers, tmp_path):
    pl.seed_everything(0)
    module = RewardModelModule(stories_path, optimizer=OptimizerConfig(lr=1e-3, schedule="linear"), normalize="none")
    # A zero head scores every sequence 0: untrained accuracy is exactly 0 (ties count as wrong).
    with torch.no_grad():
        module.model.score.weight.zero_()
    tok = module.tokenizer
    train = _rule_pairs(
        ["Tom", "Lily", "Ben", "Sue", "Max", "Anna", "Tim", "Mia"],
        ["park", "garden", "school", "shop", "beach", "forest"],
        " {n} was {w} all day.",
    )
    random.Random(0).shuffle(train)
    # Held out: other names, other places and another sentence.
    held_out = _rule_pairs(
        ["Sam", "Lucy", "Jack", "Emma"], ["farm", "zoo", "river", "house"], " The {p} made {n} feel very {w}."
    )
    dm = helpers.BatchListDataModule(
        train=[helpers.preference_batch(tok, train[i : i + 8]) for i in range(0, len(train), 8)],
        val=[helpers.preference_batch(tok, held_out[i : i + 8]) for i in range(0, len(held_out), 8)],
    )
    trainer = helpers.cpu_trainer(tmp_path, max_steps=12, check_val_every_n_epoch=100)
    trainer.validate(module, datamodule=dm, verbose=False)
    assert float(trainer.callback_metrics["val/accuracy"]) == 0.0
    trainer.fit(module, datamodule=dm)
    trainer.validate(module, datamodule=dm, verbose=False)
    accuracy = float(trainer.callback_metrics["val/accuracy"])
    print(f"held-out accuracy of the happy/sad rule after 12 steps: {accuracy:.4f}")
    assert accuracy > 0.9
    assert float(trainer.callback_metrics["val/margin"]) > 0.3  # measured 0.78
    assert module.exported_path == (tmp_path / "model").absolute()


# ----- normalisation: the fit-end path --------------------------------------------------------------


class _CaptureBeforeFold(pl.Callback):
    """Callbacks' on_fit_end runs after the module's on_train_end (normalise) and before its on_fit_end (fold)."""

    def __init__(self, batches):
        self.batches, self.scores = batches, None

    def on_fit_end(self, trainer, module):
        with torch.no_grad():
            self.scores = torch.cat([module(b["input_ids"], b["attention_mask"]) for b in self.batches])


def _train_pairs(helpers, tok):
    return [
        helpers.preference_batch(
            tok, [("Tom went out.", " He was happy.", " He was sad."), ("Lily", " smiled and sang.", " cried.")]
        )
    ]


def test_llama_bias_is_normalised_on_the_reference_set_and_kept_in_config(stories_path, helpers, tmp_path):
    torch.manual_seed(0)
    module = RewardModelModule(stories_path, optimizer=OptimizerConfig(lr=1e-3, schedule="linear"), normalize="bias")
    tok = module.tokenizer
    reference = []
    for texts in (TEXTS, ["The dog barked.", "Mia had a small boat and a big hat."]):
        ids, mask = helpers.pad_rows(_rows(tok, texts), tok.pad_token_id, "right")
        reference.append({"input_ids": ids, "attention_mask": mask})
    dm = helpers.ReferenceDataModule(
        train=_train_pairs(helpers, tok), val=_train_pairs(helpers, tok), reference=reference
    )
    capture = _CaptureBeforeFold(reference)
    trainer = helpers.cpu_trainer(tmp_path, max_steps=3, callbacks=[capture])
    trainer.fit(module, datamodule=dm)

    # Before the fold: the 5 reference sequences average 0 and the gain stayed 1.
    assert abs(float(capture.scores.mean())) < 1e-5
    # Llama has RMSNorm without bias and a bias-free head: the bias stays outside the weights.
    config = AutoConfig.from_pretrained(module.exported_path)
    record = getattr(config, NORMALIZATION_KEY)
    assert record["folded"] is False and record["gain"] == 1.0
    assert record["reference"] == "ReferenceDataModule.reference_dataloader()"
    assert reward_offset(config) == pytest.approx(record["bias"]) and record["bias"] != 0.0
    assert float(module.reward_gain) == 1.0 and float(module.reward_bias) == pytest.approx(record["bias"])

    exported = AutoModelForSequenceClassification.from_pretrained(module.exported_path, num_labels=1)
    with torch.no_grad():
        got = torch.cat([sequence_scores(exported, b["input_ids"], b["attention_mask"]) for b in reference])
        after = torch.cat([module(b["input_ids"], b["attention_mask"]) for b in reference])
    torch.testing.assert_close(got + reward_offset(config), capture.scores, rtol=0, atol=1e-5)
    torch.testing.assert_close(after, capture.scores, rtol=0, atol=1e-5)

    # The buffers travel in Lightning checkpoints, which load with weights_only.
    ckpt = tmp_path / "rm.ckpt"
    trainer.save_checkpoint(ckpt)
    restored = RewardModelModule.load_from_checkpoint(ckpt, weights_only=True)
    assert float(restored.reward_bias) == pytest.approx(record["bias"])
    assert restored.optimizer_config == module.optimizer_config


def test_gpt2_gain_and_bias_fold_exactly_into_the_export(gpt2_dir, helpers, tmp_path):
    torch.manual_seed(0)
    module = RewardModelModule(gpt2_dir, optimizer=OptimizerConfig(lr=1e-3, schedule="linear"), normalize="gain_bias")
    tok = module.tokenizer
    assert tok.pad_token == "<|pad|>" and tok.pad_token_id == 50257
    assert module.model.get_input_embeddings().num_embeddings == 50258
    val = [
        helpers.preference_batch(
            tok,
            [
                ("A cat", " sat on the mat.", " ran."),
                ("The sky", " is blue today.", " fell down on everyone."),
                ("Hello", " there, friend!", " go away."),
            ],
        )
    ]
    # The reference defaults to the validation pairs: chosen and rejected pooled.
    pooled = [
        {"input_ids": b[f"{side}_input_ids"], "attention_mask": b[f"{side}_attention_mask"]}
        for b in val
        for side in ("chosen", "rejected")
    ]
    capture = _CaptureBeforeFold(pooled)
    trainer = helpers.cpu_trainer(tmp_path, max_steps=3, callbacks=[capture])
    trainer.fit(module, datamodule=helpers.BatchListDataModule(train=_train_pairs(helpers, tok), val=val))

    assert abs(float(capture.scores.mean())) < 1e-5
    assert float(capture.scores.std(unbiased=False)) == pytest.approx(1.0, abs=1e-5)
    config = AutoConfig.from_pretrained(module.exported_path)
    record = getattr(config, NORMALIZATION_KEY)
    assert record["folded"] is True and record["gain"] != 1.0 and record["bias"] != 0.0
    assert record["reference"] == "BatchListDataModule.val_dataloader() chosen + rejected"
    assert reward_offset(config) == 0.0
    assert float(module.reward_gain) == 1.0 and float(module.reward_bias) == 0.0

    exported = AutoModelForSequenceClassification.from_pretrained(module.exported_path, num_labels=1)
    assert exported.get_input_embeddings().num_embeddings == 50258 and exported.config.pad_token_id == 50257
    with torch.no_grad():
        got = torch.cat([sequence_scores(exported, b["input_ids"], b["attention_mask"]) for b in pooled])
        # Hugging Face's own pooling (last non-pad id) agrees on these right-padded rows.
        native = torch.cat(
            [exported(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[:, 0] for b in pooled]
        )
    torch.testing.assert_close(got, capture.scores, rtol=0, atol=1e-5)
    torch.testing.assert_close(native, capture.scores, rtol=0, atol=1e-5)


def test_normalisation_without_reference_data_fails_before_training(stories_path, helpers, tmp_path):
    module = RewardModelModule(stories_path, normalize="bias")
    loader = DataLoader(_train_pairs(helpers, module.tokenizer), batch_size=None)
    trainer = helpers.cpu_trainer(tmp_path, max_steps=1)
    with pytest.raises(ValueError, match="needs reference data"):
        trainer.fit(module, train_dataloaders=loader)
    assert trainer.global_step == 0
    # A datamodule whose validation set is empty is caught before training too.
    empty_val = helpers.BatchListDataModule(train=_train_pairs(helpers, module.tokenizer), val=[])
    trainer = helpers.cpu_trainer(tmp_path, max_steps=1)
    with pytest.raises(ValueError, match="is empty"):
        trainer.fit(module, datamodule=empty_val)
    assert trainer.global_step == 0
    # normalize="none" needs no reference and records the identity.
    module = RewardModelModule(stories_path, normalize="none", export_dir=str(tmp_path / "out"))
    helpers.cpu_trainer(tmp_path, max_steps=1).fit(module, train_dataloaders=loader)
    record = getattr(AutoConfig.from_pretrained(tmp_path / "out"), NORMALIZATION_KEY)
    assert record == {"gain": 1.0, "bias": 0.0, "reference": "none", "folded": True}


def test_invalid_normalize_is_refused(stories_path):
    with pytest.raises(ValueError, match="normalize must be"):
        RewardModelModule(stories_path, normalize="mean")


# ----- the fold itself (rlhf_lit/models/reward_norm.py) ----------------------------------------------


def test_gain_and_bias_by_hand():
    assert gain_and_bias(2.0, 4.0, "none") == (1.0, 0.0)
    assert gain_and_bias(2.0, 4.0, "bias") == (1.0, -2.0)
    assert gain_and_bias(2.0, 4.0, "gain_bias") == (0.25, -0.5)  # (x - 2) / 4 = 0.25 x - 0.5
    with pytest.raises(ValueError, match="std > 0"):
        gain_and_bias(2.0, 0.0, "gain_bias")


def _logits(model, ids, mask):
    with torch.no_grad():
        return sequence_scores(model, ids, mask)


@pytest.fixture()
def gpt2_rm(gpt2_dir):
    from rlhf_lit.tokenizer import load_tokenizer

    tok = load_tokenizer(gpt2_dir)
    torch.manual_seed(1)
    model = load_reward_model(gpt2_dir, tok)
    ids = torch.tensor([[464, 3797, 3332, 13, 50256], [40, 588, 50256, 50257, 50257]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    return model, ids, mask


def test_fold_into_gpt2_final_layernorm(gpt2_rm):
    model, ids, mask = gpt2_rm
    assert model.score.bias is None
    before = _logits(model, ids, mask)
    ln_bias = model.transformer.ln_f.bias.detach().clone()
    assert fold_normalization(model, gain=2.0, bias=-0.75) is True
    torch.testing.assert_close(_logits(model, ids, mask), 2.0 * before - 0.75, rtol=0, atol=1e-5)
    # delta = b w / |w|^2 with the already scaled w: w . delta == b.
    delta = model.transformer.ln_f.bias.detach() - ln_bias
    assert float(model.score.weight[0].detach().double() @ delta.double()) == pytest.approx(-0.75, abs=1e-6)


def test_fold_into_a_head_bias(gpt2_rm):
    model, ids, mask = gpt2_rm
    head = torch.nn.Linear(32, 1, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.score.weight)
        head.bias.fill_(0.5)
    model.score = head
    before = _logits(model, ids, mask)
    ln_bias = model.transformer.ln_f.bias.detach().clone()
    assert fold_normalization(model, gain=3.0, bias=1.25) is True
    torch.testing.assert_close(_logits(model, ids, mask), 3.0 * before + 1.25, rtol=0, atol=1e-5)
    assert float(model.score.bias.detach()) == pytest.approx(3.0 * 0.5 + 1.25)  # 2.75
    assert torch.equal(model.transformer.ln_f.bias, ln_bias)  # the head took it all


def test_llama_fold_keeps_only_the_gain(stories_path):
    torch.manual_seed(2)
    model = load_reward_model(stories_path)
    ids = torch.tensor([[1, 274, 287, 286, 393, 2], [1, 274, 287, 2, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    before = _logits(model, ids, mask)
    assert fold_normalization(model, gain=2.0, bias=0.3) is False
    torch.testing.assert_close(_logits(model, ids, mask), 2.0 * before, rtol=0, atol=1e-6)
    assert fold_normalization(model, gain=0.5, bias=0.0) is True  # no bias: nothing left over
    torch.testing.assert_close(_logits(model, ids, mask), before, rtol=0, atol=1e-6)


def test_record_and_offset(stories_path):
    config = AutoConfig.from_pretrained(stories_path)
    assert reward_offset(config) == 0.0
    record_normalization(config, 1.0, -0.4, "ref", folded=False)
    assert reward_offset(config) == -0.4
    assert getattr(config, NORMALIZATION_KEY) == {"gain": 1.0, "bias": -0.4, "reference": "ref", "folded": False}
    record_normalization(config, 2.0, 0.7, "ref2", folded=True)
    assert reward_offset(config) == 0.0  # an earlier unfolded bias is not carried along

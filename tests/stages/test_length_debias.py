"""The length-disentangled reward model (``length_debias.method: odin``, rlhf_lit/stages/reward_heads/odin_head.py):
its two heads, its loss against an independent re-implementation, its export (the quality head alone)
and its refusals."""

from __future__ import annotations

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rlhf_lit.models import load_reward_model, sequence_scores
from rlhf_lit.stages import RewardModelModule
from rlhf_lit.stages.optim import OptimizerConfig
from rlhf_lit.stages.reward_heads import odin_head as debias
from rlhf_lit.stages.reward_heads.head import TrainingStep, response_lengths

ODIN = {"method": "odin", "correlation_weight": 0.7, "orthogonality_weight": 1.3}
TRIPLES = [  # responses of different lengths, so the length terms are not degenerate
    ("Tom went out.", " He was happy.", " He was sad and he cried all day long."),
    ("Lily", " smiled and sang a song with her mom.", " cried."),
    ("The dog", " ran to the park and played with a ball.", " sat."),
    ("Mia had a hat.", " It was red.", " It was a small blue hat that she did not like."),
]


def _odin(stories_path, **kwargs) -> RewardModelModule:
    return RewardModelModule(stories_path, normalize="none", length_debias=ODIN, **kwargs)


def test_the_quality_head_is_the_plain_head_and_the_length_head_is_fresh(stories_path):
    torch.manual_seed(0)
    plain = RewardModelModule(stories_path, normalize="none")
    torch.manual_seed(0)
    odin = _odin(stories_path)
    weight = odin.model.score.weight
    assert weight.shape == (2, plain.model.score.weight.shape[1])
    assert odin.model.config.num_labels == 2
    torch.testing.assert_close(weight[debias.QUALITY], plain.model.score.weight[0], rtol=0, atol=0)
    assert not torch.equal(weight[debias.LENGTH], weight[debias.QUALITY])
    d = weight.shape[1]  # the RM init, N(0, 1/sqrt(d + 1)): a loose check of the fresh row's scale
    assert 0.5 / (d + 1) ** 0.5 < float(weight[debias.LENGTH].detach().std()) < 1.5 / (d + 1) ** 0.5


def _hand_odin_loss(heads: np.ndarray, lengths: np.ndarray, weight: np.ndarray, config: dict) -> float:
    """ODIN's loss in float64 numpy: BT on the heads' sum, |rho(q, L)| - rho(l, L), |cos(w_q, w_l)|."""
    B = len(heads) // 2
    total = heads.sum(axis=1)
    preference = np.mean(np.log1p(np.exp(-(total[:B] - total[B:]))))  # -log sigmoid(chosen - rejected)
    rho_quality = np.corrcoef(heads[:, 0], lengths)[0, 1]
    rho_length = np.corrcoef(heads[:, 1], lengths)[0, 1]
    cos = abs(weight[0] @ weight[1]) / (np.linalg.norm(weight[0]) * np.linalg.norm(weight[1]))
    return (
        preference
        + config["correlation_weight"] * (abs(rho_quality) - rho_length)
        + config["orthogonality_weight"] * cos
    )


def test_the_loss_equals_an_independent_reimplementation(stories_path, helpers):
    torch.manual_seed(0)
    module = _odin(stories_path)
    tok = module.tokenizer
    batch = helpers.preference_batch(tok, TRIPLES)
    with torch.no_grad():
        heads = sequence_scores(module.model, *module.batch_sequences(batch))  # (2B, 2)
        loss, stats = module.head.loss(module.model, module.batch_sequences(batch), batch, TrainingStep(0, 0, 0))
        # Hugging Face's own pooling (its last non-pad token; the stories pad id never occurs in the text)
        hf = torch.cat(
            [
                module.model(input_ids=batch[f"{s}_input_ids"], attention_mask=batch[f"{s}_attention_mask"]).logits
                for s in ("chosen", "rejected")
            ]
        )
    torch.testing.assert_close(heads, hf, rtol=0, atol=1e-5)
    lengths = []  # response tokens: the encoded response (ending with EOS) of each row, chosen then rejected
    for side in (1, 2):
        lengths += [len(helpers.encode_pair(tok, t[0], t[side])[1]) for t in TRIPLES]
    np.testing.assert_array_equal(response_lengths(batch).numpy(), lengths)
    weight = module.model.score.weight.detach().double().numpy()
    expected = _hand_odin_loss(hf.double().numpy(), np.array(lengths, dtype=float), weight, ODIN)
    assert float(loss) == pytest.approx(expected, abs=2e-5)
    assert float(stats["quality_length_correlation"]) == pytest.approx(
        np.corrcoef(hf[:, 0].double().numpy(), lengths)[0, 1], abs=1e-5
    )


def test_ranking_batches_measure_each_row_after_its_prompt():
    batch = {
        "input_ids": torch.zeros(3, 6, dtype=torch.long),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]]),
        "group": torch.tensor([0, 1, 0]),
        "rank": torch.tensor([0, 0, 1]),
        "prompt_length": torch.tensor([2, 1, 2]),
        "responses_per_prompt": torch.tensor([2, 1]),
    }
    assert response_lengths(batch).tolist() == [3, 2, 4]
    with pytest.raises(ValueError, match="needs each batch's prompt_length"):
        response_lengths({k: v for k, v in batch.items() if k != "prompt_length"})


class _HeadsAtFitEnd(pl.Callback):
    """Callbacks' on_fit_end runs before the module's on_fit_end, which drops the length head."""

    def __init__(self, batch):
        self.batch, self.heads, self.rewards = batch, None, None

    def on_fit_end(self, trainer, module):
        with torch.no_grad():
            self.heads = sequence_scores(module.model, *module.batch_sequences(self.batch))  # (2B, 2)
            self.rewards = module(*module.batch_sequences(self.batch))  # (2B,) what validation and normalisation read


def test_training_moves_both_heads_and_the_export_is_the_quality_head_alone(stories_path, helpers, tmp_path):
    pl.seed_everything(0)
    module = _odin(stories_path, optimizer=OptimizerConfig(lr=1e-3, schedule="constant"))
    before = module.model.score.weight.detach().clone()
    batch = helpers.preference_batch(module.tokenizer, TRIPLES)
    capture = _HeadsAtFitEnd(batch)
    trainer = helpers.cpu_trainer(tmp_path, max_steps=3, callbacks=[capture], logger=pl.loggers.CSVLogger(tmp_path))
    trainer.fit(module, datamodule=helpers.BatchListDataModule(train=[batch], val=[batch]))
    trained = capture.heads
    assert trained.shape == (8, 2)
    torch.testing.assert_close(capture.rewards, trained[:, debias.QUALITY], rtol=0, atol=0)
    logged = trainer.logged_metrics
    for name in ("preference_loss", "quality_length_correlation", "length_head_correlation", "head_orthogonality"):
        assert f"train/{name}" in logged
    assert -1 <= float(logged["val/length_correlation"]) <= 1

    export = load_reward_model(str(module.exported_path), module.tokenizer)
    assert export.config.num_labels == 1 and export.score.weight.shape == (1, before.shape[1])
    assert module.model.score.weight.shape == (1, before.shape[1])  # the module holds the exported head too
    with torch.no_grad():
        scores = sequence_scores(export, *module.batch_sequences(batch))  # (2B,)
    torch.testing.assert_close(scores, trained[:, debias.QUALITY], rtol=0, atol=1e-5)
    assert not torch.allclose(export.score.weight[0], before[debias.QUALITY])  # it trained


def test_the_preference_loss_is_taken_on_the_sum_of_the_heads(stories_path, helpers):
    torch.manual_seed(0)
    module = _odin(stories_path)
    batch = helpers.preference_batch(module.tokenizer, TRIPLES)
    heads = torch.tensor(
        [[0.3, 1.0], [0.1, -0.2], [0.0, 0.5], [2.0, 0.0], [0.2, -1.0], [0.4, 0.1], [1.0, 0.2], [-0.5, 0.3]]
    )
    _, stats = debias.odin_loss(module.length_debias, heads, module.model.score.weight, batch)
    total = heads.sum(dim=1)
    expected = -F.logsigmoid(total[:4] - total[4:]).mean()
    assert float(stats["preference_loss"]) == pytest.approx(float(expected), abs=1e-6)
    assert float(stats["accuracy"]) == pytest.approx(float((total[:4] > total[4:]).float().mean()))


def test_unsupported_settings_are_refused_in_one_line(stories_path):
    with pytest.raises(ValueError, match="length_debias.method must be one of none, odin; got 'shortest'"):
        RewardModelModule(stories_path, length_debias={"method": "shortest"})
    with pytest.raises(ValueError, match="length_debias.correlation_weight must be a number >= 0, got -1"):
        RewardModelModule(stories_path, length_debias={"method": "odin", "correlation_weight": -1})
    with pytest.raises(ValueError, match="not supported with ensemble.members > 1"):
        RewardModelModule(stories_path, length_debias=ODIN, ensemble={"members": 2})
    with pytest.raises(ValueError, match="not supported with lora"):
        RewardModelModule(stories_path, length_debias=ODIN, lora={"r": 4, "export": "merged"})


@pytest.mark.parametrize("debias", [{"method": "none"}, ODIN])
def test_mixed_precision_with_gradient_clipping_trains(stories_path, helpers, tmp_path, debias):
    # The stage optimizes its Hugging Face model; fused AdamW must be ruled out from the fitting
    # trainer's precision, or Lightning's mixed-precision plugin refuses to clip (RuntimeError at the
    # first step: seen on an H100 under bf16-mixed, and the same on the CPU).
    pl.seed_everything(0)
    module = RewardModelModule(stories_path, normalize="none", length_debias=debias)
    batch = helpers.preference_batch(module.tokenizer, TRIPLES)
    trainer = helpers.cpu_trainer(tmp_path, max_steps=2, precision="bf16-mixed", gradient_clip_val=1.0)
    trainer.fit(module, datamodule=helpers.BatchListDataModule(train=[batch]))
    assert trainer.global_step == 2
    assert not trainer.optimizers[0].defaults.get("fused")

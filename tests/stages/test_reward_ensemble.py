"""Reward-model ensembles in the RM stage: members train as single RMs would, per-member normalisation,
the ensemble export and its loader, M = 1 is the single RM, checkpoints hold every member."""

from __future__ import annotations

import copy
import json

import lightning.pytorch as pl
import pytest
import torch
from torch.testing import assert_close
from transformers import AutoModelForSequenceClassification

from rlhf_lit.models import sequence_scores
from rlhf_lit.models.lora import LoRAConfig
from rlhf_lit.models.reward_ensemble import (
    ENSEMBLE_FILE,
    RewardEnsemble,
    is_reward_ensemble,
    load_reward_ensemble,
    member_paths,
)
from rlhf_lit.models.reward_norm import reward_offset
from rlhf_lit.stages import RewardModelModule
from rlhf_lit.stages.optim import OptimizerConfig
from rlhf_lit.stages.reward_heads.ensemble_head import EnsembleConfig, bootstrap_weight
from rlhf_lit.stages.reward_heads.head import preference_loss

torch.set_num_threads(1)

OPT = OptimizerConfig(lr=1e-3, schedule="constant")
TRIPLES = [
    ("Tom went out.", " He was happy.", " He was sad."),
    ("Lily", " smiled and sang.", " cried."),
    ("A dog", " ran in the sun.", " bit."),
]
TEXTS = ["Once upon a time there was a cat.", "Tom ran.", "Lily saw a big red ball in the park.", "The dog barked."]


def _reference(helpers, tok):
    rows = [tok(t).input_ids + [tok.eos_token_id] for t in TEXTS]
    ids, mask = helpers.pad_rows(rows, tok.pad_token_id, "right")
    return [{"input_ids": ids, "attention_mask": mask}]


def _train(helpers, tok):
    return [helpers.preference_batch(tok, TRIPLES[:2]), helpers.preference_batch(tok, TRIPLES[1:])]


def test_each_member_takes_the_steps_of_the_single_rm_with_its_seed(stories_path, helpers, tmp_path):
    """Sum of the members' losses and per-member clipping: member m is the single RM its head init gives."""
    ensemble = RewardModelModule(
        stories_path, optimizer=OPT, normalize="none", ensemble=EnsembleConfig(members=2, seeds=[5, 6])
    )
    assert isinstance(ensemble.model, RewardEnsemble) and ensemble.model.size == 2
    heads = [m.score.weight.detach().clone() for m in ensemble.model.members]
    assert not torch.equal(heads[0], heads[1])  # own seeds, own heads
    singles = []
    for head in heads:
        single = RewardModelModule(stories_path, optimizer=OPT, normalize="none")
        with torch.no_grad():
            single.model.score.weight.copy_(head)
        singles.append(single)
    tok = ensemble.tokenizer
    grads = []  # the first step's score-head gradients, before clipping (Lightning clips after this hook)

    class FirstGradients(pl.Callback):
        def on_before_optimizer_step(self, trainer, module, optimizer):
            if trainer.global_step == 0:
                models = module.model.members if isinstance(module.model, RewardEnsemble) else [module.model]
                grads.append([m.score.weight.grad.clone() for m in models])

    # gradient_clip_val 0.05 is below these gradients' norms: clipping is active on every step.
    for i, module in enumerate((ensemble, *singles)):
        dm = helpers.BatchListDataModule(train=_train(helpers, tok))
        trainer = helpers.cpu_trainer(
            tmp_path / str(i), max_steps=2, gradient_clip_val=0.05, callbacks=[FirstGradients()]
        )
        trainer.fit(module, datamodule=dm)
    for m in range(2):  # each member's gradient is its own loss's, not a share of the members' mean
        assert_close(grads[0][m], grads[1 + m][0])
    for member, single in zip(ensemble.model.members, singles):
        for (name, got), (_, want) in zip(member.named_parameters(), single.model.named_parameters()):
            assert_close(got, want, msg=name)
    assert not torch.equal(ensemble.model.members[0].score.weight, heads[0])  # it did train


def test_members_1_is_the_single_reward_model(stories_path, helpers):
    torch.manual_seed(3)
    plain = RewardModelModule(stories_path, optimizer=OPT, normalize="none")
    torch.manual_seed(3)
    one = RewardModelModule(stories_path, optimizer=OPT, normalize="none", ensemble=EnsembleConfig(members=1))
    assert not isinstance(one.model, RewardEnsemble) and one.reward_gain.shape == ()
    assert plain.state_dict().keys() == one.state_dict().keys()
    batch = helpers.preference_batch(plain.tokenizer, TRIPLES)
    losses = []
    for module in (plain, one):
        loss, _ = preference_loss(module.raw_scores(*module.batch_sequences(batch)), batch)
        loss.backward()
        losses.append((loss, module.model.score.weight.grad))
    assert torch.equal(losses[0][0], losses[1][0]) and torch.equal(losses[0][1], losses[1][1])


def test_each_member_is_normalised_on_its_own_scale(stories_path, helpers):
    """A member whose head is 10x another's gets 1/10 the gain: after gain_bias the two agree (std 0)."""
    module = RewardModelModule(stories_path, normalize="gain_bias", ensemble=EnsembleConfig(members=2, seeds=[1, 2]))
    with torch.no_grad():
        second = module.model.members[1]
        second.load_state_dict(module.model.members[0].state_dict())
        second.score.weight.mul_(10.0)
    reference = _reference(helpers, module.tokenizer)
    gains, biases = module.normalize(reference, "test")
    assert gains[0] == pytest.approx(10 * gains[1], rel=1e-5) and biases[0] == pytest.approx(biases[1], rel=1e-5)
    with torch.no_grad():
        scores = module(reference[0]["input_ids"], reference[0]["attention_mask"])  # (4, 2)
    # By the definition of gain_bias: each column has mean 0 and population std 1 on the reference set.
    assert_close(scores.mean(0), torch.zeros(2), rtol=0, atol=1e-5)
    assert_close(scores.std(0, unbiased=False), torch.ones(2), rtol=0, atol=1e-5)
    assert_close(scores[:, 0], scores[:, 1], rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "lora", [None, LoRAConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"])], ids=["full", "lora"]
)
def test_export_and_reload_give_the_module_scores(stories_path, helpers, tmp_path, lora, monkeypatch):
    monkeypatch.setenv("PL_GLOBAL_SEED", "41")  # seed_everything(41): unset seeds follow it, 41 + m
    module = RewardModelModule(
        stories_path,
        optimizer=OPT,
        normalize="gain_bias",
        export_dir=str(tmp_path / "ens"),
        ensemble=EnsembleConfig(members=3, data_weights="bootstrap"),
        lora=lora,
    )
    tok = module.tokenizer
    reference = _reference(helpers, tok)
    dm = helpers.ReferenceDataModule(train=_train(helpers, tok), val=_train(helpers, tok), reference=reference)
    helpers.cpu_trainer(tmp_path, max_steps=2).fit(module, datamodule=dm)
    ids, mask = reference[0]["input_ids"], reference[0]["attention_mask"]
    with torch.no_grad():
        want = module(ids, mask)  # (4, 3) the normalised member scores (after the fold)
    assert_close(want.mean(0), torch.zeros(3), rtol=0, atol=1e-5)  # normalised per member
    assert_close(want.std(0, unbiased=False), torch.ones(3), rtol=0, atol=1e-5)

    path = tmp_path / "ens"
    assert is_reward_ensemble(path) and not is_reward_ensemble(stories_path)
    manifest = json.loads((path / ENSEMBLE_FILE).read_text())
    assert manifest["design"] == "separate" and [m["seed"] for m in manifest["members"]] == [41, 42, 43]
    gains = [m["normalization"]["gain"] for m in manifest["members"]]
    assert len(set(gains)) == 3  # each member its own gain
    reloaded = load_reward_ensemble(path, tok)
    # The LoRA export is merged (W + BA written as one weight): float32 rounding of the merge, ~2e-5 measured.
    tolerance = 1e-5 if lora is None else 1e-4
    with torch.no_grad():
        assert_close(reloaded(ids, mask), want, rtol=tolerance, atol=tolerance)
        # Outside rlhf-lit: each member is a plain Hugging Face reward model (plus its config's offset).
        for m, member_dir in enumerate(member_paths(path)):
            plain = AutoModelForSequenceClassification.from_pretrained(member_dir)
            got = sequence_scores(plain, ids, mask) + reward_offset(plain.config)
            assert_close(got, want[:, m], rtol=tolerance, atol=tolerance)


def test_a_checkpoint_holds_every_member(stories_path, helpers, tmp_path):
    module = RewardModelModule(stories_path, optimizer=OPT, normalize="none", ensemble=EnsembleConfig(members=2))
    trainer = helpers.cpu_trainer(tmp_path, max_steps=1)
    trainer.fit(module, datamodule=helpers.BatchListDataModule(train=_train(helpers, module.tokenizer)))
    trainer.save_checkpoint(tmp_path / "ens.ckpt")
    restored = RewardModelModule.load_from_checkpoint(tmp_path / "ens.ckpt", weights_only=True)
    assert restored.ensemble == EnsembleConfig(members=2) and restored.model.size == 2
    for got, want in zip(restored.model.state_dict().values(), module.model.state_dict().values()):
        assert torch.equal(got, want)
    assert restored.reward_gain.shape == (2,)


def test_a_resumed_ensemble_ends_where_an_uninterrupted_run_ends(stories_path, helpers, tmp_path):
    """Resume from a checkpoint after epoch 0 (of 2): every member, its optimizer state and its bootstrap
    draws continue as if the run had not stopped."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    config = EnsembleConfig(members=2, seeds=[3, 4], data_weights="bootstrap")

    def module():
        return RewardModelModule(stories_path, optimizer=OPT, normalize="none", ensemble=config)

    def data(tok):
        return helpers.BatchListDataModule(train=_train(helpers, tok))

    whole = module()
    helpers.cpu_trainer(tmp_path / "whole", max_steps=4).fit(whole, datamodule=data(whole.tokenizer))
    first = module()
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
    stopped = helpers.cpu_trainer(tmp_path / "first", max_steps=4, enable_checkpointing=True, callbacks=[saver])
    stopped.fit(first, datamodule=data(first.tokenizer))
    (after_epoch_0,) = [p for p in (tmp_path / "ckpt").glob("*.ckpt") if "step=2" in p.name]
    resumed = module()
    trainer = helpers.cpu_trainer(tmp_path / "resumed", max_steps=4)
    trainer.fit(resumed, datamodule=data(resumed.tokenizer), ckpt_path=after_epoch_0)
    assert trainer.global_step == 4
    for (name, got), want in zip(resumed.model.named_parameters(), whole.model.parameters()):
        assert torch.equal(got, want), name


def test_bootstrap_weights_are_poisson_counts_fixed_by_seed_and_batch():
    a = bootstrap_weight(7, 1000, 0, 3, 0, "cpu")
    assert torch.equal(a, bootstrap_weight(7, 1000, 0, 3, 0, "cpu"))  # a resumed run draws the same
    assert not torch.equal(a, bootstrap_weight(8, 1000, 0, 3, 0, "cpu"))  # another member, other counts
    assert not torch.equal(a, bootstrap_weight(7, 1000, 1, 3, 0, "cpu"))  # another epoch, other counts
    assert torch.equal(a, a.round()) and a.min() >= 0
    assert float(a.mean()) == pytest.approx(1.0, abs=0.1) and float(a.var()) == pytest.approx(1.0, abs=0.15)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"members": 0}, "ensemble.members must be an integer >= 1"),
        ({"members": 2, "seeds": [1]}, "one seed per member"),
        ({"members": 2, "data_weights": "boot"}, "ensemble.data_weights must be one of uniform, bootstrap"),
        ({"members": 2, "design": "shared_trunk"}, "ensemble.design must be one of separate"),
        ({"members": 1, "data_weights": "bootstrap"}, "apply to ensemble.members > 1"),
    ],
)
def test_bad_ensemble_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EnsembleConfig(**kwargs)


def test_a_copy_of_an_ensemble_scores_like_it(stories_path, helpers):
    """The members are independent modules (deep copies), not views of one model."""
    module = RewardModelModule(stories_path, normalize="none", ensemble=EnsembleConfig(members=2))
    members = module.model.members
    assert members[0].model.embed_tokens.weight.data_ptr() != members[1].model.embed_tokens.weight.data_ptr()
    ens = copy.deepcopy(module.model)
    ref = _reference(helpers, module.tokenizer)[0]
    with torch.no_grad():
        assert torch.equal(
            ens(ref["input_ids"], ref["attention_mask"]), module(ref["input_ids"], ref["attention_mask"])
        )


def test_an_ensemble_is_refused_under_fsdp_before_any_step(stories_path):
    """configure_model (the first thing a fit does with the model) refuses a device mesh in one line."""
    module = RewardModelModule(stories_path, normalize="none", ensemble=EnsembleConfig(members=2))
    module._device_mesh = object()  # what the fsdp / fsdp2 strategy gives the module
    with pytest.raises(ValueError, match=r"^ensemble.members > 1 is not supported under fsdp / fsdp2 .*ddp$"):
        module.configure_model()

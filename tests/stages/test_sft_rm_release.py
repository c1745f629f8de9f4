"""SFT and the reward model stage free their optimizer states at the end of fit
(StageModule.release_after_fit, from the base ``on_train_end``), before Lightning's teardown would
copy them to host memory; the trained model, its export and ``last.ckpt`` are as training left them.
PPO's and DPO's frozen models are tested in tests/ppo/test_release_after_fit.py and test_dpo.py."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import Strategy

from rlhf_lit.callbacks import Checkpoint
from rlhf_lit.stages import RewardModelModule, SFTModule
from rlhf_lit.stages.base import StageModule
from rlhf_lit.stages.optim import OptimizerConfig


class AtTeardown:
    """Records, when ``Strategy.teardown`` runs, the optimizer-state bytes it would copy to the host
    and the model's weights as they are then."""

    def __init__(self, monkeypatch) -> None:
        self.state_bytes: int | None = None
        teardown = Strategy.teardown

        def spy(strategy) -> None:
            states = [v for opt in strategy.optimizers for s in opt.state.values() for v in s.values()]
            self.state_bytes = sum(v.numel() * v.element_size() for v in states if torch.is_tensor(v))
            self.weights = {k: v.detach().clone() for k, v in strategy.lightning_module.model.state_dict().items()}
            teardown(strategy)

        monkeypatch.setattr(Strategy, "teardown", spy)


class Moments(Callback):
    """At the callbacks' ``on_train_end`` (before the module's, which releases): Adam's moments."""

    def on_train_end(self, trainer, pl_module) -> None:
        self.moments = [{k: v.clone() for k, v in s.items()} for opt in trainer.optimizers for s in opt.state.values()]


def _sft(stories_path, helpers):
    module = SFTModule(stories_path, optimizer=OptimizerConfig(lr=1e-3))
    batch = helpers.sft_batch(module.tokenizer, [("Once upon a time", " there was a cat."), ("Tom", " ran home.")])
    return module, helpers.BatchListDataModule(train=[batch] * 2)


def _reward_model(stories_path, helpers):
    module = RewardModelModule(stories_path, optimizer=OptimizerConfig(lr=1e-3), normalize="bias")
    tok = module.tokenizer
    pairs = [
        helpers.preference_batch(
            tok, [("Tom went out.", " He was happy.", " He was sad."), ("Lily", " smiled and sang.", " cried.")]
        )
    ]
    rows = [tok(t).input_ids + [tok.eos_token_id] for t in ("Tom ran.", "Lily saw a big red ball.")]
    ids, mask = helpers.pad_rows(rows, tok.pad_token_id)
    return module, helpers.ReferenceDataModule(
        train=pairs * 2, val=pairs, reference=[{"input_ids": ids, "attention_mask": mask}]
    )


@pytest.mark.parametrize("build", [_sft, _reward_model], ids=["sft", "reward_model"])
@pytest.mark.parametrize("release", ["released", "kept (before)"])
def test_the_teardown_copies_no_optimizer_states_and_last_ckpt_keeps_them(
    stories_path, helpers, tmp_path, monkeypatch, build, release
):
    if release == "kept (before)":  # how it was: the teardown copied Adam's moments to the host
        monkeypatch.setattr(StageModule, "release_after_fit", lambda self: None)
    at_teardown, moments = AtTeardown(monkeypatch), Moments()
    torch.manual_seed(0)
    module, data = build(stories_path, helpers)
    module.export_dir = str(tmp_path / "export")
    trainer = helpers.cpu_trainer(
        tmp_path,
        max_steps=2,
        enable_checkpointing=True,
        callbacks=[moments, Checkpoint(dirpath=tmp_path / "ckpt", save_last=True)],
    )
    trainer.fit(module, datamodule=data)

    trainable = [p for opt in trainer.optimizers for g in opt.param_groups for p in g["params"]]
    assert moments.moments and len(moments.moments) == len(trainable)  # training had Adam moments
    if release == "released":
        assert at_teardown.state_bytes == 0 and module.released_after_fit
        assert all(len(opt.state) == 0 and opt.param_groups[0]["params"] for opt in trainer.optimizers)
    else:  # exp_avg and exp_avg_sq of every trained parameter, plus a scalar step each
        assert at_teardown.state_bytes == sum(2 * 4 * p.numel() + 4 for p in trainable)

    # last.ckpt was written before the release: it holds the moments training ended with.
    last = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    saved = [s for opt in last["optimizer_states"] for s in opt["state"].values()]
    assert len(saved) == len(moments.moments)
    assert all(torch.equal(s["exp_avg_sq"], m["exp_avg_sq"]) for s, m in zip(saved, moments.moments))
    # The model the teardown moved is the trained one, untouched by the release.
    after = module.model.state_dict()
    assert after.keys() == at_teardown.weights.keys()
    assert all(torch.equal(after[k], v) for k, v in at_teardown.weights.items())
    assert module.exported_path is not None and module.exported_path.exists()

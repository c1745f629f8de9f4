"""Exact resume: stop after rollout k, resume from the checkpoint, run to n == run straight to n."""

from __future__ import annotations

import math

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from ppo_helpers import TINYSTORIES, tiny_module, tiny_trainer

from rlhf_lit.data import PromptDataModule
from rlhf_lit.stages.optim import OptimizerConfig

TIMING = ("time/",)  # wall-clock metrics differ between runs


# A warmup and a decay, so the resumed scheduler state matters too; a large LR so states diverge fast.
SCHEDULE = OptimizerConfig(lr=3e-4, eps=1e-5, warmup_steps=1, schedule="linear")


def _data(module, batch_size=4):
    # 16 prompts, 4 per rollout: 4 rollouts per epoch; 6 rollouts cross an epoch boundary. Resuming
    # after rollout 2 leaves exactly as many batches in the epoch as were done (a Lightning corner).
    return PromptDataModule(
        tokenizer=module.tokenizer,
        train_path=TINYSTORIES,
        format="paragraphs",
        max_records=16,
        batch_size=batch_size,
        seed=3,
    )


def _comparable(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if not k.startswith(TIMING)}


def test_resume_after_rollout_k_matches_straight_run(tmp_path):
    # 2 epochs x 2 minibatches x 2 optimizers = 8 optimizer steps (global_step) per rollout.
    steps_per_rollout = 8
    straight = tiny_module(max_rollouts=6, optimizer=SCHEDULE)
    ckpt = ModelCheckpoint(
        dirpath=tmp_path / "ckpt", every_n_train_steps=steps_per_rollout, save_top_k=-1, filename="{step}"
    )
    trainer = tiny_trainer(tmp_path, enable_checkpointing=True, callbacks=[ckpt])
    trainer.fit(straight, _data(straight))
    full = trainer.logger.history
    assert sorted(full) == [0, 1, 2, 3, 4, 5]
    assert straight.rollout_index == 6

    for k in (2, 5):  # mid-epoch 0 (rollout 2 of 3) and mid-epoch 1
        resumed = tiny_module(max_rollouts=6, optimizer=SCHEDULE)
        trainer = tiny_trainer(tmp_path / f"resume{k}")
        trainer.fit(resumed, _data(resumed), ckpt_path=str(tmp_path / "ckpt" / f"step={k * steps_per_rollout}.ckpt"))
        part = trainer.logger.history
        assert sorted(part) == list(range(k, 6)), f"resumed from {k}"
        for step in range(k, 6):
            a, b = _comparable(full[step]), _comparable(part[step])
            assert a.keys() == b.keys()
            for name in a:
                same = (math.isnan(a[name]) and math.isnan(b[name])) or a[name] == pytest.approx(
                    b[name], rel=1e-6, abs=1e-7
                )
                assert same, f"rollout {step} {name}: straight {a[name]} resumed {b[name]}"
        for p, q in zip(straight.policy.parameters(), resumed.policy.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
        assert resumed.kl_ctl.value == pytest.approx(straight.kl_ctl.value, rel=1e-9)


def test_resume_refuses_a_model_directory_replaced_in_place(tmp_path):
    # The same sft_model path, different files (an SFT re-run with export_existing: replace): the
    # KL reference would silently change, so the resume is refused.
    import json
    import shutil

    from lightning.pytorch.callbacks import ModelCheckpoint
    from ppo_helpers import STORIES

    from rlhf_lit.stages.resume import ResumeMismatch

    sft = tmp_path / "sft"
    shutil.copytree(STORIES, sft)
    module = tiny_module(sft_model=str(sft), reward_model=STORIES, max_rollouts=1)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    tiny_trainer(tmp_path, enable_checkpointing=True, callbacks=[ckpt]).fit(module, _data(module))
    config = json.loads((sft / "config.json").read_text())
    (sft / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-6}))
    resumed = tiny_module(sft_model=str(sft), reward_model=STORIES, max_rollouts=2)
    with pytest.raises(
        ResumeMismatch, match=r"model.sft_model \(its files\): checkpoint '[0-9a-f]{16}', now '[0-9a-f]{16}'"
    ):
        tiny_trainer(tmp_path / "r").fit(resumed, _data(resumed), ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))


@pytest.fixture(scope="module")
def one_rollout(tmp_path_factory):
    """A one-process run of one rollout and its ``last.ckpt``."""
    from ppo_helpers import STORIES

    root = tmp_path_factory.mktemp("one_rollout")
    module = tiny_module(max_rollouts=1, reward_model=STORIES)
    ckpt = ModelCheckpoint(dirpath=root / "ckpt", save_last=True)
    tiny_trainer(root, enable_checkpointing=True, callbacks=[ckpt]).fit(module, _data(module))
    return root / "ckpt" / "last.ckpt"


def test_a_checkpoint_from_before_whiten_scope_resumes_with_the_scope_it_was_trained_with(one_rollout, tmp_path):
    from ppo_helpers import STORIES

    from rlhf_lit.stages.ppo.checkpointing import fill_whiten_scope

    checkpoint = torch.load(one_rollout, weights_only=False)
    del checkpoint["hyper_parameters"]["ppo"]["whiten_scope"]  # as an older version wrote it
    torch.save(checkpoint, tmp_path / "older.ckpt")
    resumed = tiny_module(max_rollouts=2, reward_model=STORIES)
    trainer = tiny_trainer(tmp_path / "r")
    trainer.fit(resumed, _data(resumed), ckpt_path=str(tmp_path / "older.ckpt"))  # one process: global
    assert sorted(trainer.logger.history) == [1]
    # Written by several processes: they whitened per rank, which a resume must ask for.
    several = {"hyper_parameters": {"ppo": {"epochs": 2}}, "ppo": {"world_size": 2}}
    fill_whiten_scope(several)
    assert several["hyper_parameters"]["ppo"] == {"epochs": 2, "whiten_scope": "rank"}


def test_a_one_process_checkpoint_is_refused_on_two_processes(one_rollout):
    """The data position, the per-rank seeds and the whitening rows all depend on the number of
    processes: a resume under another number is refused, naming it."""
    from types import SimpleNamespace

    from ppo_helpers import STORIES

    from rlhf_lit.stages.resume import ResumeMismatch

    resumed = tiny_module(max_rollouts=2, reward_model=STORIES)
    resumed._trainer = SimpleNamespace(
        world_size=2,
        state=SimpleNamespace(fn="fit"),
        datamodule=None,
        precision="32-true",
        accumulate_grad_batches=1,
        max_steps=-1,
        max_epochs=-1,
    )
    with pytest.raises(ResumeMismatch, match=r"\n  trainer.world_size: checkpoint 1, now 2\n"):
        resumed.on_load_checkpoint(torch.load(one_rollout, weights_only=False))

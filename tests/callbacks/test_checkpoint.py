"""RolloutCheckpoint: saves after rollouts n, 2n, ...; ModelCheckpoint options; exact resume;
atomic writes (a write that dies midway leaves the previous file whole)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch import Callback
from lightning.pytorch.plugins.io import TorchCheckpointIO

from rlhf_lit.artifacts import replace_path
from rlhf_lit.callbacks import RolloutCheckpoint
from rlhf_lit.callbacks.checkpoint import OLD_SUFFIX, temporary_path
from rlhf_lit.data import PromptDataModule

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ppo"))
from ppo_helpers import TINYSTORIES, tiny_module, tiny_trainer  # noqa: E402

# tiny_module: 2 PPO epochs x (4 rows / minibatch 2) x 2 optimizers = 8 optimizer steps per rollout
STEPS_PER_ROLLOUT = 8


def _data(module) -> PromptDataModule:
    return PromptDataModule(
        tokenizer=module.tokenizer, train_path=TINYSTORIES, format="paragraphs", max_records=16, batch_size=4, seed=3
    )


def _load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


class FilesAtBatchStart(Callback):
    """Records (rollouts finished, files in ``directory``) at each batch start, i.e. what the
    previous batch's checkpointing left (checkpoint callbacks run after all others)."""

    def __init__(self, directory: Path) -> None:
        self.directory, self.seen = directory, []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        files = sorted(os.listdir(self.directory)) if self.directory.exists() else []
        self.seen.append((pl_module.rollout_index, files))


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """5 rollouts: A saves every 2nd rollout (all kept, plus last); B every rollout, best 2 by score."""
    root = tmp_path_factory.mktemp("straight")
    module = tiny_module(max_rollouts=5)
    a = RolloutCheckpoint(dirpath=str(root / "a"), every_n_rollouts=2, save_top_k=-1, save_last=True)
    b = RolloutCheckpoint(dirpath=str(root / "b"), monitor="score", mode="max", save_top_k=2)
    spy = FilesAtBatchStart(root / "a")
    trainer = tiny_trainer(root, enable_checkpointing=True, callbacks=[a, b, spy])
    trainer.fit(module, _data(module))
    return SimpleNamespace(root=root, module=module, trainer=trainer, a=a, b=b, spy=spy)


def test_saves_exactly_after_rollouts_n_2n(straight):
    ckpts = ["last.ckpt", "rollout=2.ckpt"]
    assert straight.spy.seen == [(0, []), (1, []), (2, ckpts), (3, ckpts), (4, ckpts + ["rollout=4.ckpt"])]
    a = straight.root / "a"
    assert sorted(os.listdir(a)) == ["last.ckpt", "rollout=2.ckpt", "rollout=4.ckpt"]  # no temporary left
    # last.ckpt is the state at the end of fit (rollout 5), not the last periodic save (rollout 4).
    for name, rollout in [("rollout=2.ckpt", 2), ("rollout=4.ckpt", 4), ("last.ckpt", 5)]:
        ckpt = _load(a / name)
        assert ckpt["ppo"]["rollout_index"] == rollout
        assert ckpt["global_step"] == rollout * STEPS_PER_ROLLOUT
        assert not any(k.startswith(("ref_policy.", "reward_model.")) for k in ckpt["state_dict"])
    assert straight.a.last_model_path == str(a / "last.ckpt")


def test_model_checkpoint_options_monitor_and_top_k(straight):
    history = straight.trainer.logger.history  # rollout r is logged at step r - 1
    scores = {r: history[r - 1]["objective/scores"] for r in range(1, 6)}
    best = sorted(scores, key=scores.get, reverse=True)[:2]
    assert sorted(os.listdir(straight.root / "b")) == sorted(f"rollout={r}.ckpt" for r in best)
    assert straight.b.best_model_path == str(straight.root / "b" / f"rollout={best[0]}.ckpt")
    assert float(straight.b.best_model_score) == pytest.approx(scores[best[0]], rel=1e-6)


def test_resume_from_a_rollout_checkpoint(straight, tmp_path):
    module = tiny_module(max_rollouts=5)
    callback = RolloutCheckpoint(dirpath=str(tmp_path / "ckpt"), every_n_rollouts=2, save_top_k=-1, save_last=True)
    spy = FilesAtBatchStart(tmp_path / "ckpt")
    trainer = tiny_trainer(tmp_path, enable_checkpointing=True, callbacks=[callback, spy])
    trainer.fit(module, _data(module), ckpt_path=str(straight.root / "a" / "rollout=2.ckpt"))
    # continues after rollout 2 and does not save rollout 2 again
    assert [r for r, _ in spy.seen] == [2, 3, 4] and sorted(trainer.logger.history) == [2, 3, 4]
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["last.ckpt", "rollout=4.ckpt"]
    assert module.rollout_index == 5
    # the resumed rollout-4 checkpoint holds the straight run's rollout-4 state
    resumed, original = _load(tmp_path / "ckpt" / "rollout=4.ckpt"), _load(straight.root / "a" / "rollout=4.ckpt")
    assert resumed["global_step"] == original["global_step"] == 4 * STEPS_PER_ROLLOUT
    assert resumed["state_dict"].keys() == original["state_dict"].keys()
    for key, value in original["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][key], value, rtol=1e-6, atol=1e-7, msg=key)
    for p, q in zip(straight.module.policy.parameters(), module.policy.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


class DiesMidWrite(TorchCheckpointIO):
    """Writes only the first half of the ``fail_at``-th checkpoint, then raises (a crash mid-write)."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.fail_at, self.calls = fail_at, 0

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        self.calls += 1
        if self.calls < self.fail_at:
            return super().save_checkpoint(checkpoint, path, storage_options)
        super().save_checkpoint(checkpoint, path, storage_options)
        data = Path(path).read_bytes()
        Path(path).write_bytes(data[: len(data) // 2])
        raise OSError("No space left on device (simulated)")


def test_a_write_that_dies_midway_leaves_the_previous_file_whole(tmp_path):
    ckpt = tmp_path / "ckpt"
    module = tiny_module(max_rollouts=4)
    callback = RolloutCheckpoint(dirpath=str(ckpt), every_n_rollouts=2, save_top_k=-1, save_last=True)
    # writes: rollout=2 (1), last (2), rollout=4 (3), last (4: dies halfway)
    trainer = tiny_trainer(tmp_path, enable_checkpointing=True, callbacks=[callback], plugins=[DiesMidWrite(4)])
    with pytest.raises(OSError, match="simulated"):
        trainer.fit(module, _data(module))
    assert sorted(os.listdir(ckpt)) == [".last.ckpt.tmp", "last.ckpt", "rollout=2.ckpt", "rollout=4.ckpt"]
    assert _load(ckpt / "last.ckpt")["ppo"]["rollout_index"] == 2  # the previous last.ckpt, whole
    assert _load(ckpt / "rollout=4.ckpt")["ppo"]["rollout_index"] == 4
    with pytest.raises(Exception):  # noqa: B017 (torch.load's error for a cut file varies by version)
        _load(ckpt / ".last.ckpt.tmp")  # the half-written file only ever had the temporary name

    # a new run in the directory removes the leftover and resumes from last.ckpt
    module = tiny_module(max_rollouts=3)
    callback = RolloutCheckpoint(dirpath=str(ckpt), every_n_rollouts=2, save_top_k=-1, save_last=True)
    trainer = tiny_trainer(tmp_path / "again", enable_checkpointing=True, callbacks=[callback])
    trainer.fit(module, _data(module), ckpt_path=str(ckpt / "last.ckpt"))
    assert module.rollout_index == 3 and sorted(trainer.logger.history) == [2]
    assert sorted(os.listdir(ckpt)) == ["last.ckpt", "rollout=2.ckpt", "rollout=4.ckpt"]


# ----------------------------------------------------------------------------------- units


def test_names_and_argument_checks(tmp_path):
    d = str(tmp_path)
    rollout = {"rollout": torch.tensor(3)}
    assert RolloutCheckpoint(dirpath=d).format_checkpoint_name(dict(rollout)) == os.path.join(d, "rollout=3.ckpt")
    plain = RolloutCheckpoint(dirpath=d, auto_insert_metric_name=False)
    assert plain.format_checkpoint_name(dict(rollout)) == os.path.join(d, "rollout=3.ckpt")
    custom = RolloutCheckpoint(dirpath=d, filename="{rollout:04d}-{score:.2f}")
    assert custom.format_checkpoint_name({**rollout, "score": torch.tensor(1.5)}) == os.path.join(
        d, "rollout=0003-score=1.50.ckpt"
    )
    assert temporary_path(os.path.join(d, "last.ckpt")) == os.path.join(d, ".last.ckpt.tmp")
    assert RolloutCheckpoint(every_n_rollouts=2).state_key != RolloutCheckpoint(every_n_rollouts=3).state_key
    with pytest.raises(ValueError, match="every_n_rollouts must be >= 1, got 0"):
        RolloutCheckpoint(every_n_rollouts=0)
    # Every ModelCheckpoint argument reaches it as given; its own step and epoch triggers are off (0).
    given = RolloutCheckpoint(
        dirpath=d,
        monitor="score",
        verbose=True,
        save_last="link",
        save_top_k=3,
        save_on_exception=True,
        save_weights_only=True,
        mode="max",
        enable_version_counter=False,
    )
    assert (given.dirpath, given.monitor, given.verbose, given.save_last, given.save_top_k) == (
        d,
        "score",
        True,
        "link",
        3,
    )
    assert (given.save_on_exception, given.save_weights_only, given.mode, given._enable_version_counter) == (
        True,
        True,
        "max",
        False,
    )
    assert (given._every_n_train_steps, given._every_n_epochs, given.filename) == (0, 0, "{rollout}")


class _NoRollouts(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch, batch_idx):
        return (self.w * batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_module_without_rollout_index_is_refused(tmp_path):
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        max_steps=1,
        default_root_dir=str(tmp_path),
        callbacks=[RolloutCheckpoint(dirpath=str(tmp_path))],
    )
    with pytest.raises(TypeError, match="needs a module with an integer `rollout_index`"):
        trainer.fit(_NoRollouts(), torch.utils.data.DataLoader(torch.ones(2, 1)))


def test_replace_swaps_files_links_and_directories(tmp_path):
    (tmp_path / "new").write_text("new")
    (tmp_path / "ckpt").write_text("old")
    replace_path(str(tmp_path / "new"), str(tmp_path / "ckpt"), OLD_SUFFIX)
    assert (tmp_path / "ckpt").read_text() == "new" and not (tmp_path / "new").exists()
    # a sharded (directory) checkpoint over an older one: the old one is moved aside, then removed
    for name, text in [("dir_new", "new shard"), ("dir", "old shard")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "shard0").write_text(text)
    (tmp_path / "dir" / "shard1").write_text("stale")
    replace_path(str(tmp_path / "dir_new"), str(tmp_path / "dir"), OLD_SUFFIX)
    assert sorted(os.listdir(tmp_path / "dir")) == ["shard0"]
    assert (tmp_path / "dir" / "shard0").read_text() == "new shard"
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "dir"]


def test_save_last_link_is_renamed_into_place(tmp_path):
    (tmp_path / "rollout=2.ckpt").write_text("2")
    (tmp_path / "last.ckpt").write_text("an older copy")
    barriers = []
    trainer = SimpleNamespace(is_global_zero=True, strategy=SimpleNamespace(barrier=lambda *a: barriers.append(a)))
    RolloutCheckpoint._link_checkpoint(trainer, str(tmp_path / "rollout=2.ckpt"), str(tmp_path / "last.ckpt"))
    assert os.readlink(tmp_path / "last.ckpt") == "rollout=2.ckpt"
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt", "rollout=2.ckpt"] and len(barriers) == 1

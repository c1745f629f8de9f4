"""RunProgressBar: its total is the run's length (max_rollouts, or the real step count) and a resumed
run's bar starts at the restored count; the CLI installs it only where a bar is wanted."""

from __future__ import annotations

from types import SimpleNamespace

from lightning.pytorch.callbacks import TQDMProgressBar

from rlhf_lit.callbacks import RunProgressBar
from rlhf_lit.cli import default_progress_bar


def _trainer(**kwargs) -> SimpleNamespace:
    base = {
        "global_step": 0,
        "estimated_stepping_batches": float("inf"),
        "max_epochs": -1,
        "current_epoch": 0,
        "progress_bar_metrics": {},
        "loggers": [],
        "num_training_batches": 16,
    }
    return SimpleNamespace(**{**base, **kwargs})


def _started(trainer, module) -> RunProgressBar:
    bar = RunProgressBar()
    bar._trainer = trainer  # what setup() does
    bar.on_train_start(trainer, module)
    return bar


def test_a_resumed_ppo_bar_starts_at_the_restored_rollout_and_ends_at_max_rollouts():
    # Resumed at rollout 5 of 8; global_step (optimizer steps: 16 per rollout) and the loader length
    # must not be the count.
    module = SimpleNamespace(rollout_index=5, max_rollouts=8)
    trainer = _trainer(global_step=80, progress_bar_metrics={"score": 0.25, "kl": 1.5})
    bar = _started(trainer, module)
    tqdm = bar.train_progress_bar
    assert (tqdm.total, tqdm.n, tqdm.initial, tqdm.unit) == (8, 5, 5, "rollout")
    module.rollout_index, trainer.global_step = 6, 96
    bar.on_train_batch_end(trainer, module, None, None, batch_idx=0)
    assert tqdm.n == 6
    assert tqdm.postfix == "score=0.250, kl=1.500"  # no v_num
    assert tqdm.format_dict["initial"] == 5  # rate and ETA count the one rollout this process ran


def test_a_step_bar_counts_optimizer_steps_out_of_the_real_total():
    bar = _started(_trainer(global_step=4, estimated_stepping_batches=10, max_epochs=3), SimpleNamespace())
    assert (bar.train_progress_bar.total, bar.train_progress_bar.n, bar.train_progress_bar.unit) == (10, 4, "step")
    unbounded = _started(_trainer(), SimpleNamespace())  # max_steps -1, max_epochs -1: no total, no ETA
    assert unbounded.train_progress_bar.total is None


def test_the_cli_adds_the_bar_only_where_a_bar_is_wanted_and_none_is_configured():
    assert isinstance(default_progress_bar({}), RunProgressBar)
    assert isinstance(default_progress_bar({"enable_progress_bar": True, "callbacks": []}), RunProgressBar)
    assert default_progress_bar({"enable_progress_bar": False}) is None  # Lightning refuses a bar then
    assert default_progress_bar({"callbacks": [TQDMProgressBar()]}) is None  # the config's own bar
    assert default_progress_bar({"callbacks": TQDMProgressBar()}) is None


def test_every_bar_writes_to_stderr_and_the_training_bar_reads_seconds_per_unit():
    import sys

    trainer = _trainer(state=SimpleNamespace(fn="fit"))
    bar = _started(trainer, SimpleNamespace(rollout_index=0, max_rollouts=4))
    bars = {"train": bar.train_progress_bar, "validation": bar.init_validation_tqdm(), "sanity": bar.init_sanity_tqdm()}
    assert all(b.fp._wrapped is sys.stderr for b in bars.values())  # stdout stays clean for results
    assert bars["train"].bar_format == RunProgressBar.BAR_FORMAT  # rate_fmt: "40.0s/rollout"
    assert "{rate_fmt}" in RunProgressBar.BAR_FORMAT
    assert bars["validation"].bar_format == bars["sanity"].bar_format == TQDMProgressBar.BAR_FORMAT
    # Below the training bar while fitting; the validation bar is cleared, the sanity bar too.
    assert (-bars["validation"].pos, bars["validation"].leave, bars["sanity"].leave) == (
        1,
        False,
        False,
    )  # tqdm: -position

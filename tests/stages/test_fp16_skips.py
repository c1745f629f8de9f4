"""fp16 (``16-mixed``): the steps the GradScaler skips are counted (rlhf_lit.stages.nonfinite).

Lightning turns ``precision="16-mixed"`` on a CPU into ``bf16-mixed`` (no scaler), so these tests
give the Trainer the fp16 plugin with a real CPU ``torch.amp.GradScaler``, as a CUDA run gets it.
"""

from __future__ import annotations

import logging

import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision

from rlhf_lit.stages import SFTModule
from rlhf_lit.stages.nonfinite import NonFiniteError, NonFiniteGuard
from rlhf_lit.stages.optim import OptimizerConfig

X = 300.0
"""Input and loss factor of :func:`_scaled_step`: the fp16 weight gradient is X * X * scale = 90000 *
scale, over fp16's largest value (65504) at scale >= 1 and finite (45000) at 0.5."""


def _scaled_step(guard, scaler, weight, loss_factor: float = 1.0, any_rank=lambda flag: flag) -> bool:
    """One step as Lightning's MixedPrecision plugin takes it: scaled backward, unscale, the guard, then
    the scaler's step and update. Returns the guard's verdict."""
    opt = torch.optim.SGD([weight], lr=1e-6)
    with torch.autocast("cpu", dtype=torch.float16):
        out = torch.nn.functional.linear(torch.full((1, 2), X), weight)  # (1, 1) float16
    loss = out.float().sum() * X * loss_factor  # 180000 * factor, finite unless the factor is not
    guard.note_loss(loss)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    verdict = guard.check_optimizer(opt, "the optimizer", "step", loss_scale=scaler.get_scale(), any_rank=any_rank)
    scaler.step(opt)
    scaler.update()
    weight.grad = None
    return verdict


def test_overflows_while_the_scale_calibrates_are_not_counted_and_those_at_scale_one_are(caplog):
    caplog.set_level(logging.INFO, logger="rlhf_lit")
    guard, scaler = NonFiniteGuard(2, "max_skipped_updates"), torch.amp.GradScaler("cpu", init_scale=4.0)
    weight = torch.nn.Parameter(torch.ones(1, 2))
    verdicts = []
    for _ in range(4):
        verdicts.append((scaler.get_scale(), _scaled_step(guard, scaler, weight), dict(guard.consecutive)))
    assert verdicts == [
        (4.0, False, {}),  # overflow at scales 4 and 2: the scaler's calibration, logged, not counted
        (2.0, False, {}),
        (1.0, False, {"the optimizer": 1}),  # an overflow at scale 1: the gradients do not fit in fp16
        (0.5, True, {"the optimizer": 0}),  # 45000: finite, stepped, the run of skips is over
    ]
    assert guard.total == 3
    assert caplog.text.count("not counted toward max_skipped_updates") == 2
    assert "skipped by the fp16 GradScaler at loss scale 1" in caplog.text
    assert not torch.equal(weight.detach(), torch.ones(1, 2))  # the last step moved the weight


def test_a_non_finite_loss_counts_at_any_scale_and_stops_the_run():
    guard, scaler = NonFiniteGuard(2, "max_skipped_updates"), torch.amp.GradScaler("cpu")  # scale 65536
    weight = torch.nn.Parameter(torch.ones(1, 2))
    assert _scaled_step(guard, scaler, weight, loss_factor=float("nan")) is False
    assert guard.consecutive == {"the optimizer": 1}
    # Another rank's loss was NaN (the gradients are averaged, so every rank's overflow): counted here too.
    assert (
        _scaled_step(NonFiniteGuard(2, "m"), torch.amp.GradScaler("cpu"), weight, any_rank=lambda flag: True) is False
    )
    with pytest.raises(
        NonFiniteError,
        match=r"2 updates in a row skipped .*GradScaler at loss scale 32768; the loss "
        r"was not finite \(max_skipped_updates=2\)",
    ):
        _scaled_step(guard, scaler, weight, loss_factor=float("nan"))
    assert torch.equal(weight.detach(), torch.ones(1, 2))  # the scaler skipped both steps


def test_the_losses_of_one_step_are_read_together_by_each_of_its_optimizers():
    weight = torch.nn.Parameter(torch.ones(2))
    weight.grad = torch.full((2,), float("inf"))  # overflowed (unscaled) gradients
    opt = torch.optim.SGD([weight], lr=1.0)
    guard = NonFiniteGuard(5, "max_skipped_updates")
    guard.note_loss(torch.tensor(float("nan")))  # two accumulated losses, the first NaN
    guard.note_loss(torch.tensor(1.0))
    for kind in ("the policy", "the critic"):  # PPO: two optimizers step on one backward pass
        assert guard.check_optimizer(opt, kind, "step 0", loss_scale=4.0) is False
    assert guard.consecutive == {"the policy": 1, "the critic": 1}
    guard.note_loss(torch.tensor(1.0))  # the next step's only loss: finite, so a calibration skip
    assert guard.check_optimizer(opt, "the policy", "step 1", loss_scale=2.0) is False
    assert guard.consecutive == {"the policy": 1, "the critic": 1} and guard.total == 3


def _fp16_trainer(helpers, tmp_path, max_steps: int, scaler: torch.amp.GradScaler):
    plugin = MixedPrecision("16-mixed", device="cpu", scaler=scaler)
    return helpers.cpu_trainer(tmp_path, max_steps=max_steps, plugins=[plugin])


def test_sft_under_fp16_stops_after_max_skipped_updates_of_a_nan_loss(stories_path, helpers, tmp_path):
    module = SFTModule(stories_path, optimizer=OptimizerConfig(lr=1e-2), max_skipped_updates=2)
    batch = helpers.sft_batch(module.tokenizer, [("Once upon", " a time."), ("Tom", " ran home.")])
    loss = module.loss
    module.loss = lambda b: loss(b) * float("nan")
    before = {k: v.clone() for k, v in module.model.state_dict().items()}
    trainer = _fp16_trainer(helpers, tmp_path, 4, torch.amp.GradScaler("cpu"))
    with pytest.raises(
        NonFiniteError,
        match=r"2 updates in a row skipped .*optimizer at step 1, skipped by the fp16 "
        r"GradScaler at loss scale 32768; the loss was not finite",
    ):
        trainer.fit(module, datamodule=helpers.BatchListDataModule(train=[batch] * 4))
    for key, value in module.model.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_sft_under_fp16_calibrates_its_scale_through_more_skips_than_the_limit(stories_path, helpers, tmp_path):
    module = SFTModule(stories_path, optimizer=OptimizerConfig(lr=1e-3), max_skipped_updates=2)
    batch = helpers.sft_batch(module.tokenizer, [("Once upon", " a time."), ("Tom", " ran home.")])
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24)  # too large: 10 steps overflow here
    trainer = _fp16_trainer(helpers, tmp_path, 12, scaler)
    trainer.fit(module, datamodule=helpers.BatchListDataModule(train=[batch] * 12))
    assert trainer.global_step == 12  # the run went on
    skipped = round(24 - torch.log2(torch.tensor(scaler.get_scale())).item())  # one halving per skipped step
    assert module.nonfinite.total == skipped > 2  # each logged and counted in the total ...
    assert module.nonfinite.consecutive == {"the optimizer": 0}  # ... none toward max_skipped_updates

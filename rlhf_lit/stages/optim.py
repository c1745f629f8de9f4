"""Optimizer and learning-rate schedule shared by the stages: AdamW plus warmup and a decay."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from rlhf_lit.option_values import check_finite, check_least

Schedule = Literal["constant", "linear", "cosine"]


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW hyperparameters and the learning-rate schedule.

    The schedule multiplies ``lr`` by a factor per optimizer step ``s`` (0-based):
    ``(s + 1) / warmup_steps`` during warmup, then, with ``p = (s - warmup_steps) / (total - warmup_steps)``,
    ``1`` (constant), ``m + (1 - m) * (1 - p)`` (linear) or ``m + (1 - m) * (1 + cos(pi p)) / 2``
    (cosine), where ``m = min_lr_ratio``. The factor reaches ``m`` after the last step, so
    ``schedule="linear", min_lr_ratio=0`` anneals the LR to 0 (InstructGPT's reward model).

    Args:
        lr: Peak learning rate.
        weight_decay: Decoupled weight decay, applied to matrices only (weights with 2+ dims);
            biases, norm scales and other 1-d parameters are never decayed.
        betas: Adam coefficients for the running averages of the gradient and its square.
        eps: Adam epsilon (added to the root of the second moment, PyTorch placement).
        warmup_steps: Optimizer steps of linear warmup from ``lr / warmup_steps`` to ``lr``.
        schedule: Shape of the decay after warmup.
        min_lr_ratio: Final LR as a fraction of ``lr`` (``linear`` and ``cosine`` only).
    """

    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_steps: int = 0
    schedule: Schedule = "constant"
    min_lr_ratio: float = 0.0

    def __post_init__(self) -> None:
        # YAML and checkpoint round trips give a list; keep the tuple so configs compare equal.
        object.__setattr__(self, "betas", tuple(self.betas))
        check_least("optimizer.lr", self.lr, 0, strict=True)
        check_least("optimizer.weight_decay", self.weight_decay, 0)
        for name in ("lr", "weight_decay", "eps"):  # inf: NaN weights after one step, or (eps) no step at all
            check_finite(f"optimizer.{name}", getattr(self, name))
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"optimizer.betas must be two numbers in [0, 1), got {self.betas}")
        check_least("optimizer.eps", self.eps, 0, strict=True)
        check_least("optimizer.warmup_steps", self.warmup_steps, 0)
        if self.schedule not in ("constant", "linear", "cosine"):
            raise ValueError(f"optimizer.schedule must be constant, linear or cosine; got {self.schedule!r}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"optimizer.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.schedule == "constant" and self.min_lr_ratio != 0.0:
            raise ValueError("optimizer.min_lr_ratio has no effect with schedule='constant'; leave it at 0")


def lr_factor(step: int, config: OptimizerConfig, total_steps: int | float) -> float:
    """The multiplier of ``config.lr`` at optimizer step ``step`` (0-based); see :class:`OptimizerConfig`."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.schedule == "constant":
        return 1.0
    progress = min(1.0, (step - config.warmup_steps) / (total_steps - config.warmup_steps))
    m = config.min_lr_ratio
    if config.schedule == "linear":
        return m + (1.0 - m) * (1.0 - progress)
    return m + (1.0 - m) * 0.5 * (1.0 + math.cos(math.pi * progress))


def parameter_groups(params: Iterable[tuple[str, nn.Parameter]], weight_decay: float) -> list[dict]:
    """Split trainable named parameters into a decayed group (2+ dims) and an undecayed one (biases, norms)."""
    decay, no_decay = [], []
    for _, p in params:
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def fused_adamw_supported(module: nn.Module, trainer=None) -> bool:
    """Whether AdamW may run as torch's fused kernel for ``module``'s trainable parameters.

    The fused kernel does the same AdamW update as the default (per-tensor loop on CPU, ``foreach``
    on CUDA) in one pass per tensor, equal up to float rounding; on the peer-bench models a step
    took 2 ms instead of 11. The update is elementwise, so FSDP2's sharded (DTensor) parameters
    take the same steps as whole ones, bit for bit, and a checkpoint resumes exactly across
    strategies. It needs floating-point parameters on the CPU or a CUDA device, and no mixed
    precision (``bf16-mixed``, ``16-mixed``): a fused optimizer may unscale fp16 gradients inside
    its step, so Lightning's mixed-precision plugin refuses to clip its gradients at all (a
    ``RuntimeError`` at the first clipped step, seen with ``bf16-mixed`` on an H100). The precision
    is read from ``trainer``, else from ``module``'s own trainer (a LightningModule's): a stage that
    optimizes a plain ``nn.Module`` (its Hugging Face model) must pass its trainer, or the check
    cannot see the precision (the reward-model stage crashed so under ``bf16-mixed`` with
    ``gradient_clip_val`` on an H100).
    """
    trainer = trainer if trainer is not None else getattr(module, "_trainer", None)
    if trainer is not None and "mixed" in str(trainer.precision):
        return False
    params = [p for p in module.parameters() if p.requires_grad]
    return bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)


def build_optimizer(
    named_parameters: Iterable[tuple[str, nn.Parameter]],
    config: OptimizerConfig,
    total_steps: int | float,
    fused: bool = False,
) -> tuple[torch.optim.AdamW, LambdaLR]:
    """AdamW over the trainable parameters and its per-step LambdaLR schedule.

    Args:
        named_parameters: e.g. ``module.named_parameters()``; frozen parameters are skipped.
        config: The optimizer settings.
        total_steps: Optimizer steps of the whole run (``trainer.estimated_stepping_batches``); only
            the decaying schedules need it, and it must exceed ``warmup_steps`` for them.
        fused: use torch's fused AdamW kernel (see :func:`fused_adamw_supported`).

    Raises:
        ValueError: a decaying schedule without a finite total longer than the warmup, or no
            trainable parameter.
    """
    if config.schedule != "constant":
        if not math.isfinite(total_steps):
            raise ValueError(
                f"schedule={config.schedule!r} needs a finite number of steps; set trainer.max_steps or "
                "max_epochs, or use schedule='constant'"
            )
        if total_steps <= config.warmup_steps:
            raise ValueError(
                f"schedule={config.schedule!r}: total steps ({total_steps}) must exceed "
                f"warmup_steps ({config.warmup_steps})"
            )
    groups = parameter_groups(named_parameters, config.weight_decay)
    if not groups:
        raise ValueError("no trainable parameters to optimize")
    optimizer = torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, eps=config.eps, fused=fused or None)
    scheduler = LambdaLR(optimizer, lambda step: lr_factor(step, config, total_steps))
    return optimizer, scheduler


def lightning_optimizers(module: nn.Module, config: OptimizerConfig, total_steps: int | float, trainer) -> dict:
    """The ``configure_optimizers`` return value: the optimizer and a scheduler stepped every optimizer step
    (``trainer``: the one fitting, whose precision decides whether AdamW may be fused)."""
    fused = fused_adamw_supported(module, trainer)
    optimizer, scheduler = build_optimizer(module.named_parameters(), config, total_steps, fused)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1}}

"""KL coefficient controllers: fixed, or adaptive towards a target KL (Ziegler et al. 2019, sec. 2.2)."""

from __future__ import annotations

from typing import Any, Protocol

import torch


class KLController(Protocol):
    """What the PPO stage needs from a KL controller."""

    value: float

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


class FixedKLController:
    """A constant KL coefficient with the controller interface (``update`` does nothing).

    Args:
        kl_coef: the coefficient (beta), >= 0.
    """

    def __init__(self, kl_coef: float) -> None:
        if kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {kl_coef}.")
        self.value = float(kl_coef)

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> None:
        """No-op: the coefficient is fixed."""

    def state_dict(self) -> dict[str, Any]:
        """The coefficient as a plain float (loads with ``torch.load(weights_only=True)``)."""
        return {"value": self.value}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the coefficient saved by :meth:`state_dict`."""
        self.value = float(state_dict["value"])


class AdaptiveKLController(FixedKLController):
    """Proportional controller that moves the KL coefficient so the measured KL tracks ``target`` (a
    :class:`FixedKLController` whose ``update`` moves it; the same state).

    ``error = clip(kl / target - 1, -0.2, 0.2)`` and ``value *= 1 + error * n_steps / horizon``
    (Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences", eq. 2).

    Args:
        init_kl_coef: starting coefficient (beta), >= 0.
        target: the KL (nats per sequence, as the caller measures it) to steer towards, > 0.
        horizon: number of steps over which a full error is corrected, > 0.
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: int) -> None:
        if init_kl_coef < 0:
            raise ValueError(f"init_kl_coef must be >= 0, got {init_kl_coef}.")
        if target <= 0:
            raise ValueError(f"target must be > 0, got {target}.")
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {horizon}.")
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = horizon

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> None:
        """Adjust the coefficient after a rollout of ``n_steps`` samples with mean KL ``current_kl``."""
        # float() is one host sync per rollout; the controller keeps plain floats for checkpoints.
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

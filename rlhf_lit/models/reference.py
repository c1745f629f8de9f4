"""The PPO reference: "give me reference logprobs" behind one small interface.

Two implementations, chosen in one place (:func:`build_reference`):

- :class:`FrozenModelReference`: a separate frozen copy of the SFT model (the InstructGPT recipe);
  it may live on the CPU or in another dtype (``memory.frozen_device`` / ``frozen_dtype``, :class:`~rlhf_lit.models.memory.MemoryConfig`).
- :class:`AdapterDisabledReference`: with a LoRA policy the SFT weights are the policy's own base
  weights, so the reference is the policy with its adapters switched off: no second copy of the
  model is loaded (half the weight memory of policy + reference).

PPOModule only calls ``reference.logprobs(generated, temperature)``; DPOModule calls
``reference.apply(fn, *args)``, which runs ``fn(reference_model, *args)`` the same way (no gradient,
the frozen copy on its own device, or the policy with its adapters off).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

from rlhf_lit.models.generation import Generated
from rlhf_lit.models.lora import adapter_disabled, peft_model_of
from rlhf_lit.models.memory import call_on_own_device
from rlhf_lit.models.teacher_forced import response_logprobs

T = TypeVar("T")


class Reference:
    """What gives the reference policy's response logprobs: a subclass says how it runs a function on
    the reference model (:meth:`apply`)."""

    def logprobs(self, generated: Generated, temperature: float) -> torch.Tensor:
        """``(B, R)`` float32 logprobs of ``generated``'s response tokens under the reference, on the
        device of ``generated``; no gradient."""
        return self.apply(response_logprobs, generated, temperature).float()  # (B, R)

    def apply(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(model, *args)`` with the reference as ``model``, without gradient; a tensor result on
        the device of the first tensor argument."""
        raise NotImplementedError


class FrozenModelReference(Reference):
    """A separate frozen model (wherever it was placed); calls run on its own device.

    Args:
        model: the frozen SFT model (no gradients, eval mode).
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    @torch.no_grad()
    def apply(self, fn: Callable[..., T], *args: Any) -> T:
        """See :class:`Reference`."""
        return call_on_own_device(fn, self.model, *args)


class AdapterDisabledReference(Reference):
    """The LoRA policy with its adapters disabled: exactly the base (SFT) weights, never trained.

    Args:
        policy: the policy, carrying adapters (:func:`rlhf_lit.models.lora.with_lora`). Held as a
            plain attribute: the reference owns no weights of its own.
    """

    def __init__(self, policy: nn.Module) -> None:
        if peft_model_of(policy) is None:
            raise ValueError("an adapter-disabled reference needs a policy with LoRA adapters")
        self.policy = policy

    @torch.no_grad()
    def apply(self, fn: Callable[..., T], *args: Any) -> T:
        """See :class:`Reference`."""
        with adapter_disabled(self.policy):
            return fn(self.policy, *args)


def build_reference(policy: nn.Module, load_frozen_copy: Callable[[], nn.Module]) -> Reference:
    """The one place the reference kind is chosen: the adapter-disabled policy when the policy
    carries LoRA adapters, else a frozen copy made by ``load_frozen_copy()`` (called only then)."""
    if peft_model_of(policy) is not None:
        return AdapterDisabledReference(policy)
    return FrozenModelReference(load_frozen_copy())

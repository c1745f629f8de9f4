"""The over-optimisation guard (:class:`OverOptimisationGuard`): rules in
:mod:`~rlhf_lit.callbacks.guard.signals`, options in :mod:`~rlhf_lit.callbacks.guard.settings`."""

from rlhf_lit.callbacks.guard.callback import SIGNALS, OverOptimisationGuard
from rlhf_lit.callbacks.guard.settings import (
    DisagreementSignal, DistinctSignal, HeldOut, KeepBest, KLSignal, LengthSignal, ObjectiveSignal, ProxyGoldSignal,
)  # fmt: skip

__all__ = ["SIGNALS", "DisagreementSignal", "DistinctSignal", "HeldOut", "KLSignal", "KeepBest", "LengthSignal",
           "ObjectiveSignal", "OverOptimisationGuard", "ProxyGoldSignal"]  # fmt: skip

"""The over-optimisation guard (:class:`OverOptimisationGuard`): rules in
:mod:`~rlhf_lit.callbacks.guard.verdicts`, the signals (each a typed option set with its action, thresholds and patience) in
:mod:`~rlhf_lit.callbacks.guard.signals`."""

from rlhf_lit.callbacks.guard.callback import SIGNALS, OverOptimisationGuard
from rlhf_lit.callbacks.guard.signals import (
    DisagreementSignal,
    DistinctSignal,
    HeldOut,
    KeepBest,
    KLSignal,
    LengthSignal,
    ObjectiveSignal,
    ProxyGoldSignal,
)

__all__ = [
    "SIGNALS",
    "DisagreementSignal",
    "DistinctSignal",
    "HeldOut",
    "KLSignal",
    "KeepBest",
    "LengthSignal",
    "ObjectiveSignal",
    "OverOptimisationGuard",
    "ProxyGoldSignal",
]

"""Transition name of :mod:`rlhf_lit.callable_specs` (renamed: the old name did not say what it holds).

Only ``rlhf_lit/rewards/`` still imports it; delete this file once those imports read
``from rlhf_lit.callable_specs import resolve_callable``.
"""

from rlhf_lit.callable_specs import resolve_callable

__all__ = ["resolve_callable"]

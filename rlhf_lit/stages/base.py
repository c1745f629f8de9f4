"""What every training stage shares (SFT, reward model, DPO, PPO).

:class:`RunLayout` is how a stage declares its place in a run directory (``--run_dir``; the CLI's
:mod:`rlhf_lit.runs` reads it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RunLayout:
    """How a stage sits in a run directory: its folder name and the earlier exports it reads.

    Args:
        name: the stage's folder, ``<run_dir>/<name>/`` (short, e.g. ``sft``).
        inputs: ``{constructor argument: earlier stage name}``; an argument left unset (None)
            becomes ``<run_dir>/<earlier stage>/model``. The argument must default to None.
        skip_input: ``(argument, init_args) -> bool``: True leaves that input unset for this
            configuration (e.g. PPO's ``reward_model`` when no reward source is the RM).
    """

    name: str
    inputs: Mapping[str, str] = field(default_factory=dict)
    skip_input: Callable[[str, Mapping[str, Any]], bool] | None = None

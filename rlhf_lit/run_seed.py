"""The run's seed (``seed_everything``), from which every seed option left unset takes its value.

``rlhf-lit fit`` (LightningCLI) calls Lightning's ``seed_everything(<--seed_everything>)`` before it
builds the stage and the data module; Lightning keeps the value in the ``PL_GLOBAL_SEED``
environment variable, which the processes it starts (DDP ranks) inherit. A seed option left at
None (PPO's ``rollout_seed``; a data module's ``seed``) takes that value when its module is built,
so a changed ``--seed_everything`` changes the sampling, the minibatch shuffles and the data order;
an option set explicitly keeps its value whatever the run's seed. Without a ``seed_everything``
(``--seed_everything false``, or a module built in Python without calling it) the value is
:data:`UNSEEDED_DEFAULT`.
"""

from __future__ import annotations

import os

SEED_ENV = "PL_GLOBAL_SEED"
"""Where Lightning's ``seed_everything`` keeps the seed it set (read by Lightning itself in new processes)."""
UNSEEDED_DEFAULT = 0
"""A seed option's value when it is unset and nothing called ``seed_everything``."""
CLI_DEFAULT_SEED = 1234
"""``rlhf-lit fit``'s ``seed_everything`` when a config sets none: two runs of one config draw the same data."""

RUN_SEEDS = (0, 2**32 - 1)
"""The run seeds Lightning's ``seed_everything`` takes (numpy's, which it seeds too)."""


def run_seed_problem(seed: object, option: str) -> str | None:
    """Why ``seed``, given as ``option``, cannot be a run seed (an int outside :data:`RUN_SEEDS`), or None.
    Lightning's own refusal names no option, and ``rlhf-lit seeds`` would start a run for it."""
    if isinstance(seed, int) and not isinstance(seed, bool) and not RUN_SEEDS[0] <= seed <= RUN_SEEDS[1]:
        return f"{option} {seed}: a run seed must be in [{RUN_SEEDS[0]}, {RUN_SEEDS[1]}] (the seeds numpy takes)"
    return None


def run_seed() -> int | None:
    """The seed ``seed_everything`` set for this run (``PL_GLOBAL_SEED``), or None when it was not called."""
    value = os.environ.get(SEED_ENV, "").strip()
    return int(value) if value else None


def seed_or_run_seed(seed: int | None) -> int:
    """``seed`` when it is set, else :func:`run_seed` (else :data:`UNSEEDED_DEFAULT`)."""
    if seed is not None:
        return seed
    run = run_seed()
    return UNSEEDED_DEFAULT if run is None else run

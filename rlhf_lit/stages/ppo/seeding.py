"""Seeds of a PPO run, in one place: every random draw of sampling and shuffling comes from here.

Per-process seeds are ``rollout_seed + rank * 100003`` (N detail 14), folded with the rollout
index and a stream id into a fresh generator per use. The seed is a function of (seed, rank,
rollout, stream) only, so a resumed run draws the same numbers as an uninterrupted one.
``rollout_seed`` is the stage's option, or the run's ``seed_everything`` when the option is unset
(:mod:`rlhf_lit.run_seed`; a resume checks that the run seed is the checkpoint's).
"""

from __future__ import annotations

import torch

STREAM_SAMPLE, STREAM_SHUFFLE, STREAM_REFERENCE = 0, 1, 2
"""The random streams folded into the per-rollout seeds: sampling responses, shuffling minibatches,
sampling the reference policy's responses for a calibrated reward (``reward.calibration``: its own
stream, so turning calibration on leaves the policy's samples and the shuffles as they were)."""
RANK_STRIDE = 100003
"""Added to the seed per rank (N detail 14), so ranks sample different responses."""


def stream_seed(rollout_seed: int, rank: int, rollout_index: int, stream: int) -> int:
    """The seed of one stream of one rollout on one rank (stateless, see the module docstring)."""
    rank_seed = rollout_seed + rank * RANK_STRIDE
    return (rank_seed * 1_000_003 + rollout_index * 16 + stream) % (2**63)


def stream_generator(rollout_seed: int, rank: int, rollout_index: int, stream: int) -> torch.Generator:
    """A CPU generator seeded with :func:`stream_seed`."""
    return torch.Generator().manual_seed(stream_seed(rollout_seed, rank, rollout_index, stream))

"""Helpers of the PPO tests: a tiny real policy (stories260K), prompt data and a recording logger."""

from __future__ import annotations

import os
from pathlib import Path

import assets_paths
import torch

# tests/ is on the path: pytest's own, or the PYTHONPATH the DDP tests give their worker scripts.
from generation_helpers import EOS, PAD, STORIES, STORY_PROMPTS, EosBias, eos_biased_policy, prompt_batch  # noqa: E402, F401
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import Logger

from rlhf_lit.models import load_causal_lm
from rlhf_lit.models.generation import SamplingConfig
from rlhf_lit.stages.ppo import PPOModule
from rlhf_lit.stages.ppo.config import KLConfig, PPOConfig

TINYSTORIES = str(assets_paths.TINYSTORIES)


class RecordingLogger(Logger):
    """Keeps every ``log_metrics`` call: ``history[step] = metrics``."""

    def __init__(self) -> None:
        super().__init__()
        self.history: dict[int, dict[str, float]] = {}

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.history.setdefault(step, {}).update(metrics)


def tiny_module(**overrides) -> PPOModule:
    """stories260K as SFT model and reward model (its new score head is random: a deterministic RM)."""
    kwargs = dict(
        sft_model=STORIES,
        reward_model=STORIES,
        sampling=SamplingConfig(max_new_tokens=8, temperature=0.9),
        ppo=PPOConfig(epochs=2, minibatch_size=2),
        kl=KLConfig(kind="adaptive", init_coef=0.1, target=1.0, horizon=100),
        max_rollouts=5,
        rollout_seed=7,
    )
    kwargs.update(overrides)
    torch.manual_seed(0)  # the RM's new score head
    return PPOModule(**kwargs)


def tiny_trainer(tmp_path: Path, **overrides) -> Trainer:
    """A CPU trainer writing only under ``tmp_path``."""
    kwargs = dict(
        accelerator="cpu",
        devices=1,
        logger=RecordingLogger(),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    kwargs.update(overrides)
    return Trainer(**kwargs)


def length_judge(texts: list[str]) -> list[float]:
    """A judge for the callback tests: the number of characters."""
    return [float(len(t)) for t in texts]


JUDGED: list[list[str]] = []
"""The texts :func:`index_judge` was called with, one list per call."""


def index_judge(texts: list[str]) -> list[float]:
    """A judge for the PPO tests: records its texts and scores text i with i (batch mean (B - 1) / 2)."""
    JUDGED.append(list(texts))
    return [float(i) for i in range(len(texts))]


SEEN_REWARD_BATCHES: list = []
"""The RewardBatch objects :func:`answer_reward` was called with."""


def answer_reward(batch, *, scale: float = 1.0) -> list[float]:
    """A reward function for the PPO tests: ``scale * float(extras["answer"])``; records its batch."""
    SEEN_REWARD_BATCHES.append(batch)
    return [scale * float(a) for a in batch.extras["answer"]]


def two_part_reward(batch) -> dict[str, list[float]]:
    """A dict reward: ``length`` (response token count) and ``one`` (1.0)."""
    return {"length": [float(len(ids)) for ids in batch.response_ids], "one": [1.0] * len(batch)}


def bad_reward(batch) -> list[float]:
    """Returns one value too few."""
    return [0.0] * (len(batch) - 1)


def dot_count_reward(batch, *, token: int) -> list[float]:
    """The number of times ``token`` appears in the response ids (EOS excluded by construction)."""
    return [float(sum(1 for t in ids if t == token)) for ids in batch.response_ids]


def worker_env() -> dict[str, str]:
    """The environment of a worker script started outside pytest (``python tests/ppo/<x>_worker.py``):
    the suite's (tests/suite_env.py), with ``PYTHONPATH`` holding tests/ppo (``ppo_helpers``) and
    tests/ (``assets_paths``)."""
    from suite_env import subprocess_env

    here = Path(__file__).resolve().parent
    path = os.pathsep.join([str(here), str(here.parent), os.environ.get("PYTHONPATH", "")])
    return subprocess_env({"PYTHONPATH": path})


def assert_resumes_exactly(straight, resumed, data, tmp_path: Path, checkpoint: str) -> None:
    """Fit ``resumed`` from ``tmp_path/ckpt/<checkpoint>`` (written by ``straight``'s fit, 3 rollouts) with
    its data module ``data`` and assert it ends at rollout 3 with ``straight``'s every weight and buffer."""
    trainer = tiny_trainer(tmp_path / "resume")
    trainer.fit(resumed, data, ckpt_path=str(tmp_path / "ckpt" / checkpoint))
    assert resumed.rollout_index == 3
    for (name, p), q in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=name)


def assert_same_trained_weights(weights: dict, other: dict) -> None:
    """Two PPO runs' policy weights agree up to float rounding, and training moved some of them."""
    start = load_causal_lm(STORIES).state_dict()
    moved = 0
    for k, v in weights.items():
        torch.testing.assert_close(v, other[k], rtol=1e-5, atol=1e-7, msg=k)
        moved += not torch.equal(v, start[k])
    assert moved > 0

"""The policy inside a training checkpoint, as a Hugging Face causal LM.

A Lightning checkpoint of a stage holds the whole module's ``state_dict``: ``PPOModule`` keeps the
trained policy under ``policy.`` (beside the critic, the reference and the reward model), SFT and
DPO their model under ``model.``. The entries under that prefix, with the prefix removed, carry the
same names as the ``state_dict`` of the Hugging Face model the run started from, so loading them
(strictly) over that model gives the policy at the checkpoint: a point along training that can be
evaluated like an export (``rlhf-lit export-policy`` writes it as one:
:func:`rlhf_lit.stages.checkpoint_export.export_checkpoint_policy`).

Weights only, full precision, no LoRA: a run with LoRA adapters holds the adapter's names and fails
the strict load, naming the missing weights. :class:`~rlhf_lit.callbacks.RolloutCheckpoint` writes
``rollout=<n>.ckpt`` files (:func:`rollout_checkpoints` lists them).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

POLICY_PREFIX = "policy."
"""Where ``PPOModule`` keeps the trained policy in its ``state_dict`` (``self.policy``); SFT and DPO: ``model.``."""
CHECKPOINT_NAME = re.compile(r"rollout=(\d+)\.ckpt$")
"""``RolloutCheckpoint``'s default file name: ``rollout=<n>.ckpt``."""


def policy_state_dict(state_dict: Mapping[str, object], prefix: str = POLICY_PREFIX) -> dict[str, object]:
    """The entries of a stage's ``state_dict`` under ``prefix``, with the prefix removed.

    Raises:
        KeyError: there is none (the checkpoint is not one of that stage, or the prefix is wrong):
            loading an empty dict non-strictly would silently keep the starting weights.
    """
    weights = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
    if not weights:
        sample = ", ".join(list(state_dict)[:5])
        raise KeyError(f"no weights under {prefix!r} in the checkpoint (its first keys: {sample})")
    return weights


def load_checkpoint_policy(checkpoint: str | os.PathLike, base_model: str | os.PathLike, prefix: str = POLICY_PREFIX):
    """The policy of a checkpoint as a Hugging Face causal LM built like ``base_model``, in eval mode.

    Args:
        checkpoint: a Lightning ``.ckpt`` file (weights only or full, e.g. from ``RolloutCheckpoint``).
        base_model: the Hugging Face directory the run started from (PPO: the SFT export): it gives
            the architecture; every one of its weights is replaced (strict loading).
        prefix: where the stage keeps the policy in its ``state_dict`` (:data:`POLICY_PREFIX`).

    Raises:
        rlhf_lit.integrity.DamagedFile: ``checkpoint`` is cut short or not a checkpoint.
        KeyError: nothing under ``prefix``.
        RuntimeError: the weights under ``prefix`` do not match ``base_model`` (missing or unexpected names).
    """
    import torch
    from transformers import AutoModelForCausalLM

    from rlhf_lit.integrity import check_checkpoint

    check_checkpoint(checkpoint)  # cut short or not a checkpoint: named, not torch's zip-reader traceback
    # weights_only=False: a full PPO checkpoint also holds RNG states and the KL controller (plain
    # Python objects); load only checkpoints you trust (your own runs').
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"]
    model = AutoModelForCausalLM.from_pretrained(base_model)
    weights = policy_state_dict(state, prefix)
    if problem := misfit(model.state_dict(), weights):  # torch's own message lists every key over many lines
        raise RuntimeError(f"the weights under {prefix!r} do not fit {type(model).__name__}: {problem}")
    model.load_state_dict(weights, strict=True)  # strict: a missing weight is an error
    return model.eval()


def misfit(expected: Mapping[str, object], weights: Mapping[str, object]) -> str | None:
    """What keeps ``weights`` from loading strictly into a model whose ``state_dict`` is ``expected``, in a clause
    (the counts of missing and unexpected names and of other shapes, the first of each), or None."""

    def some(names: list[str]) -> str:
        return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")

    missing = [name for name in expected if name not in weights]
    unexpected = [name for name in weights if name not in expected]
    shapes = [
        f"{name} {tuple(value.shape)}, the model's {tuple(expected[name].shape)}"  # type: ignore[attr-defined]
        for name, value in weights.items()
        if name in expected and getattr(value, "shape", None) != getattr(expected[name], "shape", None)
    ]
    parts = [
        f"{len(names)} {what} ({some(names)})"
        for names, what in ((missing, "missing"), (unexpected, "unexpected"), (shapes, "of another shape"))
        if names
    ]
    return "; ".join(parts) or None


def rollout_checkpoints(directory: str | os.PathLike) -> dict[int, str]:
    """``rollout -> path`` of the ``rollout=<n>.ckpt`` files in ``directory``, by rollout (none: empty)."""
    if not os.path.isdir(directory):
        return {}
    found = {}
    for name in os.listdir(directory):
        match = CHECKPOINT_NAME.fullmatch(name)
        if match:
            found[int(match.group(1))] = os.path.join(directory, name)
    return dict(sorted(found.items()))

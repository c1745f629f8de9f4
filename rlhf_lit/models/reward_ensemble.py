"""A reward-model ensemble: M reward models whose scores are read side by side, ``(B, M)``.

The exported form (written by the reward-model stage with ``ensemble.members > 1``) is a directory::

    ensemble.json            format, version, design, and per member: its path, seed, normalisation
    members/member_0/ ...    each a Hugging Face AutoModelForSequenceClassification directory (one
    members/member_1/ ...    label) whose logit is that member's normalised reward, like a single
                             rlhf-lit reward-model export
    tokenizer files, rlhf_lit_export.json

so each member loads without rlhf-lit, and :func:`load_reward_ensemble` loads them all as one module.
A plain reward-model directory has no ``ensemble.json`` (:func:`is_reward_ensemble` tells them apart).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rlhf_lit.integrity import DamagedFile, check_json_file
from rlhf_lit.models.loading import ModelLoading, load_reward_model
from rlhf_lit.models.lora import exportable
from rlhf_lit.models.reward_norm import NORMALIZATION_KEY, reward_offset
from rlhf_lit.models.scoring import sequence_scores

ENSEMBLE_FILE = "ensemble.json"
ENSEMBLE_FORMAT = "rlhf-lit-reward-ensemble"
ENSEMBLE_VERSION = 1


class RewardEnsemble(nn.Module):
    """M reward models scored side by side.

    Args:
        members: the members, each a one-label ``AutoModelForSequenceClassification``.
        design: how the members were trained (recorded in ``ensemble.json``; ``separate``).
        seeds: each member's seed (recorded), or None.
    """

    def __init__(
        self, members: list[PreTrainedModel], design: str = "separate", seeds: list[int] | None = None
    ) -> None:
        super().__init__()
        if not members:
            raise ValueError("a reward ensemble needs at least one member")
        self.members = nn.ModuleList(members)
        self.design = design
        self.seeds = list(seeds) if seeds is not None else None

    @property
    def size(self) -> int:
        """M, the number of members."""
        return len(self.members)

    def raw_scores(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Each member's score head at the last real token, ``(B, M)``, before any unfolded offset."""
        return torch.stack([sequence_scores(m, input_ids, attention_mask) for m in self.members], dim=1)  # (B, M)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Each member's normalised reward ``(B, M)``: its logit plus the bias it could not fold
        (:func:`~rlhf_lit.models.reward_norm.reward_offset`, 0 when folded)."""
        offsets = torch.tensor([reward_offset(m.config) for m in self.members], device=input_ids.device)  # (M,)
        return self.raw_scores(input_ids, attention_mask) + offsets  # (B, M)

    def save_pretrained(
        self, save_directory: str | os.PathLike, state_dict: dict[str, torch.Tensor] | None = None, **kwargs: Any
    ) -> None:
        """Write ``members/member_<m>/`` (Hugging Face directories) and ``ensemble.json``.

        ``state_dict``: weights to write instead of the members' own, keyed ``members.<m>.<name>``.
        A LoRA member is written merged (:func:`~rlhf_lit.models.lora.exportable`).
        """
        root = Path(save_directory)
        records = []
        for m, member in enumerate(self.members):
            relative = f"members/member_{m}"
            prefix = f"members.{m}."
            weights = (
                None
                if state_dict is None
                else {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
            )
            exportable(member).save_pretrained(
                root / relative, **({} if weights is None else {"state_dict": weights}), **kwargs
            )
            records.append(
                {
                    "path": relative,
                    "seed": None if self.seeds is None else self.seeds[m],
                    "normalization": getattr(member.config, NORMALIZATION_KEY, None),
                }
            )
        manifest = {"format": ENSEMBLE_FORMAT, "version": ENSEMBLE_VERSION, "design": self.design, "members": records}
        (root / ENSEMBLE_FILE).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")


def is_reward_ensemble(path: str | os.PathLike | None) -> bool:
    """Whether ``path`` is an exported reward-model ensemble (a local directory with ``ensemble.json``)."""
    return path is not None and os.path.isfile(os.path.join(os.path.expanduser(str(path)), ENSEMBLE_FILE))


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    """The checked ``ensemble.json`` of an ensemble directory; ValueError naming the file and field."""
    file = os.path.join(os.path.expanduser(str(path)), ENSEMBLE_FILE)
    try:
        manifest = check_json_file(file, want_object=False)
    except DamagedFile as error:
        raise ValueError(f"reward-model ensemble {error}") from None
    except OSError as error:
        raise ValueError(f"{file}: not a readable reward-ensemble manifest ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != ENSEMBLE_FORMAT:
        raise ValueError(f"{file}: field 'format' must be {ENSEMBLE_FORMAT!r}")
    if manifest.get("version") != ENSEMBLE_VERSION:
        raise ValueError(
            f"{file}: field 'version' is {manifest.get('version')!r}; this rlhf-lit reads version {ENSEMBLE_VERSION}"
        )
    members = manifest.get("members")
    if (
        not isinstance(members, list)
        or not members
        or not all(isinstance(m, dict) and isinstance(m.get("path"), str) for m in members)
    ):
        raise ValueError(f"{file}: field 'members' must be a non-empty list of {{\"path\": ...}} entries")
    return manifest


def member_paths(path: str | os.PathLike) -> list[str]:
    """The members' directories of the ensemble at ``path``, member 0 first."""
    root = os.path.expanduser(str(path))
    return [os.path.join(root, m["path"]) for m in read_manifest(path)["members"]]


def load_reward_ensemble(
    path: str | os.PathLike, tokenizer: PreTrainedTokenizerBase | None = None, loading: ModelLoading = ModelLoading()
) -> RewardEnsemble:
    """Load the ensemble at ``path``; its forward gives each member's normalised score ``(B, M)``.

    Args:
        path: an ensemble directory (:func:`is_reward_ensemble`).
        tokenizer: the run's tokenizer (embeddings resized to it, as :func:`load_reward_model`).
        loading: how every member is loaded (:class:`~rlhf_lit.models.loading.ModelLoading`).
    """
    manifest = read_manifest(path)
    members = [load_reward_model(p, tokenizer, loading) for p in member_paths(path)]
    return RewardEnsemble(members, manifest.get("design", "separate"), [m.get("seed") for m in manifest["members"]])


def load_any_reward_model(
    path: str, tokenizer: PreTrainedTokenizerBase | None = None, loading: ModelLoading = ModelLoading()
) -> nn.Module:
    """An ensemble directory as :class:`RewardEnsemble`, anything else as one reward model
    (:func:`load_reward_model`), each loaded as ``loading`` says."""
    if is_reward_ensemble(path):
        return load_reward_ensemble(path, tokenizer, loading)
    return load_reward_model(path, tokenizer, loading)


def normalised_scores(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """A reward model's normalised reward ``(B,)``, its logit plus its unfolded offset
    (:func:`~rlhf_lit.models.reward_norm.reward_offset`); an ensemble's per member, ``(B, M)``."""
    if isinstance(model, RewardEnsemble):
        return model(input_ids, attention_mask)  # (B, M)
    return sequence_scores(model, input_ids, attention_mask) + reward_offset(model.config)  # (B,)


def reward_scores(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """One normalised reward per row, ``(B,)`` float32 (:func:`normalised_scores`; an ensemble's mean over
    members): what ``rlhf-lit evaluate`` and ``best-of-n`` read."""
    scores = normalised_scores(model, input_ids, attention_mask).float()  # (B,) or (B, M)
    return scores.mean(dim=1) if isinstance(model, RewardEnsemble) else scores  # (B,)

"""Reward normalisation: a gain and bias on the reward model's score, folded into its weights.

InstructGPT (and "The N+ implementation details of RLHF", #5) shift the trained reward model
so that a reference set of responses scores 0 on average (``normalize="bias"``); Ziegler et al.
2019 also scale it to std 1 (``"gain_bias"``). The normalised reward is ``gain * raw + bias``.

An exported reward model should give the normalised reward as its plain logit, so that
``AutoModelForSequenceClassification.from_pretrained`` needs no extra code:

- the gain is folded into ``score.weight`` (exact: the head is linear);
- the bias goes into ``score.bias`` when the head has one; else into the bias of a final
  LayerNorm whose output feeds only the head (GPT-2's ``ln_f``): adding
  ``delta = bias * w / |w|^2`` to it adds exactly ``w . delta = bias`` to the logit;
- otherwise (Llama: RMSNorm without bias and a bias-free head, so the logit is an odd function
  of the final hidden state and no constant can be represented) the bias is written to
  ``config.reward_bias``, and a user adds :func:`reward_offset` to the logit.

Either way the exported config records ``config.rlhf_lit_reward_normalization``.
"""

from __future__ import annotations

import logging
from typing import Literal

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from rlhf_lit.models.scoring import backbone, score_head
from rlhf_lit.option_values import check_least

log = logging.getLogger(__name__)

Normalize = Literal["none", "bias", "gain_bias"]

NORMALIZATION_KEY = "rlhf_lit_reward_normalization"
"""Config attribute recording ``{"gain", "bias", "reference", "folded"}`` of an exported reward model."""

REWARD_BIAS_KEY = "reward_bias"
"""Config attribute holding a bias that could not be folded into the weights (add it to the logit)."""

# Model types whose named final LayerNorm feeds the score head directly (nothing in between).
# Others (OPT has an optional project_out after its final norm) fall back to config.reward_bias.
_FINAL_LAYERNORM = {"gpt2": "ln_f", "gpt_neo": "ln_f", "gptj": "ln_f", "gpt_neox": "final_layer_norm"}


def gain_and_bias(mean: float, std: float, normalize: Normalize) -> tuple[float, float]:
    """The affine map ``gain * raw + bias`` that gives the reference scores mean 0 (and std 1).

    Args:
        mean: Mean of the raw reference scores.
        std: Their standard deviation (used by ``"gain_bias"`` only; must be > 0 there).
        normalize: ``"none"`` -> (1, 0); ``"bias"`` -> (1, -mean); ``"gain_bias"`` -> (1/std, -mean/std).
    """
    if normalize == "none":
        return 1.0, 0.0
    if normalize == "bias":
        return 1.0, -mean
    if normalize == "gain_bias":
        if not std > 0:
            raise ValueError(f"normalize='gain_bias' needs reference scores with std > 0, got std={std}")
        return 1.0 / std, -mean / std
    raise ValueError(f"normalize must be none, bias or gain_bias; got {normalize!r}")


def final_layernorm(model: PreTrainedModel) -> nn.LayerNorm | None:
    """The LayerNorm (with a bias) whose output is the score head's input, or None when not known to exist."""
    name = _FINAL_LAYERNORM.get(getattr(model.config, "model_type", ""))
    if name is None:
        return None
    norm = getattr(backbone(model), name, None)
    if isinstance(norm, nn.LayerNorm) and norm.bias is not None:
        return norm
    return None


@torch.no_grad()
def fold_normalization(model: PreTrainedModel, gain: float, bias: float) -> bool:
    """Fold ``gain * raw + bias`` into the weights of a one-label sequence-classification model, in place.

    Args:
        model: e.g. ``GPT2ForSequenceClassification`` with ``num_labels=1``.
        gain: Multiplier of the raw score (> 0).
        bias: Added after the gain.

    Returns:
        True when the model's logit now equals the normalised score; False when the bias could not
        be represented (the gain is folded all the same): add ``bias`` to the logit yourself.
    """
    check_least("gain", gain, 0, strict=True)
    head = score_head(model)
    if head.out_features != 1:
        raise ValueError(f"expected a one-label score head, got out_features={head.out_features}")
    head.weight.mul_(gain)
    if head.bias is not None:
        head.bias.mul_(gain).add_(bias)
        return True
    if bias == 0.0:
        return True
    norm = final_layernorm(model)
    w = head.weight[0].to(torch.float64)  # (D,)
    w_sq = float(w @ w)
    if norm is None or w_sq == 0.0:
        return False
    # w . (h + delta) = w . h + bias  for  delta = bias * w / |w|^2; ln_f's output feeds only the head.
    delta = bias * w / w_sq  # (D,)
    norm.bias.add_(delta.to(norm.bias.dtype))
    return True


def record_normalization(config: PretrainedConfig, gain: float, bias: float, reference: str, folded: bool) -> None:
    """Write the normalisation into a model config (saved by ``save_pretrained``).

    Always sets ``config.rlhf_lit_reward_normalization``; sets ``config.reward_bias`` to ``bias``
    when it was not folded, else to 0 (so that an older unfolded bias is never carried along).
    """
    setattr(config, NORMALIZATION_KEY, {"gain": gain, "bias": bias, "reference": reference, "folded": folded})
    setattr(config, REWARD_BIAS_KEY, 0.0 if folded else bias)
    if not folded:
        log.warning(
            "reward bias %.6g could not be folded into %s (no head bias, no known final LayerNorm with a "
            "bias): stored as config.%s; the exported logit is gain * raw and the normalised reward is "
            "logit + reward_offset(config)",
            bias,
            config.model_type,
            REWARD_BIAS_KEY,
        )


def reward_offset(config: PretrainedConfig) -> float:
    """What to ADD to an exported reward model's logit to get the normalised reward (0.0 when folded or absent)."""
    return float(getattr(config, REWARD_BIAS_KEY, 0.0) or 0.0)

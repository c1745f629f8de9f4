"""Direct preference optimisation: the DPO loss (Rafailov et al. 2023) and its variants.

Every variant is a function of the per-pair log-ratio difference

    h = (logps_chosen - ref_logps_chosen) - (logps_rejected - ref_logps_rejected)     # (B,)

where ``logps`` are sequence logprobs of the response under the trained policy and ``ref_logps``
those under the frozen reference. The variant is chosen in one place, :func:`dpo_loss` with a
:data:`DPOLossKind`:

- ``sigmoid``: ``-log sigmoid(beta h)`` (DPO, eq. 7), and with ``label_smoothing = eps > 0`` the
  conservative DPO of Mitchell (2023), which assumes each label is flipped with probability eps:
  ``-(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)``. Sequence logprobs are SUMS over
  response tokens (the likelihood of the response, as in the DPO paper).
- ``ipo``: ``(h - 1 / (2 beta))^2`` (Azar et al. 2023, IPO, eq. 17 with the regulariser tau =
  beta). Sequence logprobs are MEANS over response tokens, as in the IPO experiments and TRL's
  implementation: with sums the fixed target 1 / (2 beta) would mean something else for every
  response length. Label smoothing has no meaning here and is refused.

:func:`averages_over_tokens` tells the caller which sequence logprob a variant expects.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

DPOLossKind = Literal["sigmoid", "ipo"]
"""``sigmoid``: DPO (with ``label_smoothing``: conservative DPO); ``ipo``: identity preference optimisation."""

_AVERAGES_OVER_TOKENS: dict[str, bool] = {"sigmoid": False, "ipo": True}


def averages_over_tokens(kind: DPOLossKind) -> bool:
    """Whether ``kind`` expects sequence logprobs averaged over response tokens (True) or summed."""
    check_dpo_settings(1.0, kind, 0.0)
    return _AVERAGES_OVER_TOKENS[kind]


def check_dpo_settings(beta: float, kind: DPOLossKind, label_smoothing: float) -> None:
    """Raise ValueError naming the option for a ``beta``, ``loss`` or ``label_smoothing`` no variant accepts."""
    if kind not in _AVERAGES_OVER_TOKENS:
        raise ValueError(f"loss must be one of {', '.join(_AVERAGES_OVER_TOKENS)}; got {kind!r}")
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta!r}")
    if beta == float("inf"):  # inf times the first step's margin of 0 is NaN; IPO's target 1 / (2 beta) is 0
        raise ValueError("beta must be a finite number, got inf")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing!r}")
    if kind == "ipo" and label_smoothing != 0.0:
        raise ValueError(
            f"label_smoothing={label_smoothing!r} applies to loss='sigmoid' (conservative DPO) only; "
            "IPO has no label-noise term: set label_smoothing to 0"
        )


def sigmoid_dpo_loss(h: torch.Tensor, beta: float, label_smoothing: float = 0.0) -> torch.Tensor:
    """Per-pair (conservative) DPO loss ``-(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)``.

    Args:
        h: ``(B,)`` log-ratio differences (see the module docstring).
        beta: > 0, the strength of the implicit KL regularisation.
        label_smoothing: eps in [0, 0.5), the assumed probability that a label is flipped.

    Returns:
        ``(B,)`` losses.
    """
    logits = beta * h  # (B,)
    # logsigmoid is the stable form of log(1 / (1 + exp(-x))).
    return -(1.0 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)  # (B,)


def ipo_loss(h: torch.Tensor, beta: float) -> torch.Tensor:
    """Per-pair IPO loss ``(h - 1 / (2 beta))^2``; ``h`` from token-averaged logprobs.

    Args:
        h: ``(B,)`` log-ratio differences.
        beta: > 0 (IPO's tau): the target difference is ``1 / (2 beta)``.

    Returns:
        ``(B,)`` losses.
    """
    return (h - 1.0 / (2.0 * beta)) ** 2  # (B,)


def dpo_loss(
    logps_chosen: torch.Tensor,
    logps_rejected: torch.Tensor,
    ref_logps_chosen: torch.Tensor,
    ref_logps_rejected: torch.Tensor,
    beta: float,
    kind: DPOLossKind = "sigmoid",
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The DPO-family loss of ``kind``, mean over pairs, and the implicit-reward statistics.

    The implicit reward of a response is ``beta * (logps - ref_logps)`` (DPO, section 5).

    Args:
        logps_chosen: ``(B,)`` policy sequence logprobs of the preferred responses (with grad);
            sums or token means as :func:`averages_over_tokens` says for ``kind``.
        logps_rejected: ``(B,)`` the same for the other responses.
        ref_logps_chosen: ``(B,)`` reference sequence logprobs of the preferred responses.
        ref_logps_rejected: ``(B,)`` the same for the other responses.
        beta: > 0.
        kind: the variant (:data:`DPOLossKind`).
        label_smoothing: conservative-DPO eps in [0, 0.5) (``sigmoid`` only).

    Returns:
        ``(loss, stats)``: loss a 0-dim tensor; stats maps to detached 0-dim tensors (batch means):
        ``rewards_chosen`` / ``rewards_rejected`` (implicit rewards), ``reward_accuracy`` (fraction
        of pairs with chosen reward > rejected, strict), ``reward_margin`` (chosen - rejected
        reward, i.e. ``beta * h``) and ``implicit_kl``, the mean log ratio ``logps - ref_logps``
        over chosen and rejected responses: how far the policy moved from the reference on the
        preference data (a proxy of KL(policy || reference); it can be negative since the
        responses are not samples of the policy). No host syncs.
    """
    check_dpo_settings(beta, kind, label_smoothing)
    chosen_log_ratio = logps_chosen - ref_logps_chosen  # (B,)
    rejected_log_ratio = logps_rejected - ref_logps_rejected  # (B,)
    h = chosen_log_ratio - rejected_log_ratio  # (B,)
    if kind == "sigmoid":
        losses = sigmoid_dpo_loss(h, beta, label_smoothing)  # (B,)
    else:
        losses = ipo_loss(h, beta)  # (B,)
    return losses.mean(), implicit_reward_stats(chosen_log_ratio, rejected_log_ratio, beta)


def implicit_reward_stats(
    chosen_log_ratio: torch.Tensor, rejected_log_ratio: torch.Tensor, beta: float
) -> dict[str, torch.Tensor]:
    """The statistics of :func:`dpo_loss` (detached ``()`` batch means, no host sync) from the per-pair log
    ratios ``logps - ref_logps`` ``(B,)`` of the chosen and rejected responses: what every loss of the
    family logs (BoNBoN's too, :func:`rlhf_lit.functional.bonbon.bonbon_loss`)."""
    with torch.no_grad():
        rewards_chosen = beta * chosen_log_ratio  # (B,)
        rewards_rejected = beta * rejected_log_ratio  # (B,)
        return {
            "rewards_chosen": rewards_chosen.mean(),  # ()
            "rewards_rejected": rewards_rejected.mean(),  # ()
            "reward_accuracy": (rewards_chosen > rewards_rejected).to(chosen_log_ratio.dtype).mean(),  # ()
            "reward_margin": (rewards_chosen - rewards_rejected).mean(),  # ()
            "implicit_kl": 0.5 * (chosen_log_ratio.mean() + rejected_log_ratio.mean()),  # ()
        }

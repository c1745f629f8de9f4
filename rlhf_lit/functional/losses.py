"""Training losses: the clipped PPO value loss, Bradley-Terry reward loss, SFT loss (the PPO policy
loss: :mod:`rlhf_lit.functional.policy_losses`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlhf_lit.functional.masked_stats import masked_mean

IGNORE_INDEX = -100
"""Label of positions that do not count in the SFT loss (prompt and padding): the one definition,
which the data modules write and :func:`sft_loss` skips (``torch.nn.functional.cross_entropy``'s
default ``ignore_index``)."""


def _check_clip_range(clip_range: float) -> None:
    if clip_range <= 0:
        raise ValueError(f"clip_range must be > 0, got {clip_range}.")


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip_range: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss (the PPO2 baselines detail): the value may move at most eps from its rollout value.

    Per token: ``0.5 * max((values - returns)^2, (values_clipped - returns)^2)`` with
    ``values_clipped = old_values + clamp(values - old_values, -eps, eps)``.

    Args:
        values: ``(B, T)`` current value predictions (with grad).
        old_values: ``(B, T)`` value predictions at rollout time.
        returns: ``(B, T)`` GAE returns.
        mask: bool ``(B, T)``.
        clip_range: eps > 0, in the units of the value head.

    Returns:
        ``(loss, stats)``: loss a 0-dim tensor; stats maps ``clipfrac`` (fraction of masked tokens
        where the clipped error is strictly larger) to a detached 0-dim tensor.
    """
    _check_clip_range(clip_range)
    values_clipped = old_values + torch.clamp(values - old_values, -clip_range, clip_range)  # (B, T)
    error = (values - returns) ** 2  # (B, T)
    error_clipped = (values_clipped - returns) ** 2  # (B, T)
    loss = 0.5 * masked_mean(torch.maximum(error, error_clipped), mask)  # ()
    with torch.no_grad():
        stats = {"clipfrac": masked_mean((error_clipped > error).to(error.dtype), mask)}  # ()
    return loss, stats


def pairwise_reward_loss(
    chosen_scores: torch.Tensor,
    rejected_scores: torch.Tensor,
    margin: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bradley-Terry preference loss ``-log sigmoid(chosen - rejected - margin)``, mean over pairs.

    The optional margin (Llama 2 reward model) asks the chosen score to win by at least that much.

    Args:
        chosen_scores: ``(B,)`` reward-model scores of the preferred responses.
        rejected_scores: ``(B,)`` scores of the other responses.
        margin: ``(B,)`` or None.
        weight: ``(B,)`` or None: the loss is then the mean over pairs of ``weight * loss`` (not
            divided by the weights' sum: a bootstrap weight k counts a pair k times, 0 leaves it out).

    Returns:
        ``(loss, accuracy)``: 0-dim tensors; accuracy is the detached fraction of pairs with
        ``chosen > rejected`` (strict: ties count as wrong; the margin is not used).
    """
    diff = chosen_scores - rejected_scores  # (B,)
    if margin is not None:
        diff = diff - margin  # (B,)
    # logsigmoid is the stable form of log(1 / (1 + exp(-diff))).
    if weight is None:
        loss = -F.logsigmoid(diff).mean()  # ()
    else:
        loss = -(weight * F.logsigmoid(diff)).mean()  # ()
    accuracy = (chosen_scores > rejected_scores).to(chosen_scores.dtype).mean().detach()  # ()
    return loss, accuracy


def sft_loss(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Next-token cross-entropy: ``logits[:, t]`` predicts ``labels[:, t + 1]``.

    Args:
        logits: ``(B, T, V)`` causal-LM logits; computed in at least float32.
        labels: ``(B, T)`` token ids aligned with the inputs (not shifted), ``ignore_index`` on
            prompt and padding positions.
        ignore_index: label value that does not count.

    Returns:
        0-dim tensor, the mean over the counted (shifted) labels; NaN when no label counts. There
        is no check that raises: it would read a value back from the device on every call (the
        PPO-ptx loss runs once per minibatch). The data modules drop examples without response
        tokens at the data boundary, so a batch from them always has labels that count.
    """
    shifted_logits = logits[:, :-1]  # (B, T-1, V)
    shifted_labels = labels[:, 1:]  # (B, T-1)
    # Upcast half precision: cross-entropy over a large vocabulary in bf16 is visibly inaccurate.
    shifted_logits = shifted_logits.to(torch.promote_types(logits.dtype, torch.float32))  # (B, T-1, V)
    return F.cross_entropy(
        shifted_logits.reshape(-1, shifted_logits.shape[-1]),  # (B*(T-1), V)
        shifted_labels.reshape(-1),  # (B*(T-1),)
        ignore_index=ignore_index,
        reduction="mean",
    )  # ()

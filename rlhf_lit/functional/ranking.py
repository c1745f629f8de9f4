"""K ranked responses per prompt: their pairs, the InstructGPT reward-model loss and ranking metrics.

A ranking batch holds ``N`` rows (every response of its ``B`` prompts) with ``group (N,)``, the
row's prompt ``0..B-1``, and ``rank (N,)``, the row's rank within its prompt (0 = best, equal =
tie). Rows ``i``, ``j`` of one prompt form a pair when ``rank[i] < rank[j]`` (``i`` is the better);
tied rows form none.

The pairs are held as a dense ``(N, N)`` mask rather than as index lists: a list's length depends on
the data, so building one reads a count back from the device; the mask costs ``N^2`` booleans (a
batch of 64 prompts of 9 responses: 330k) and no sync. Per-prompt sums go through a ``(B, N)``
membership mask too (not ``index_add``), which keeps them deterministic on GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch
import torch.nn.functional as F


def is_ranking_batch(batch: Mapping[str, object]) -> bool:
    """True for a ranking batch (K responses per prompt, docs/CONTRACTS.md: it has ``group``), False
    for every other batch (pairs, SFT, prompts). The one place the test is written."""
    return "group" in batch


def batch_examples(batch: Mapping[str, torch.Tensor]) -> int:
    """B, the examples of a batch, read from shapes (no host sync): the prompts of a ranking batch
    (its ``responses_per_prompt`` is ``(B,)``; its rows are ``N >= 2B``), else the rows of its first
    tensor (every tensor of a pair, SFT or prompt batch is ``(B, ...)``)."""
    if is_ranking_batch(batch):
        return batch["responses_per_prompt"].shape[0]
    return next(iter(batch.values())).shape[0]


def ranking_pair_mask(group: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
    """Bool ``(N, N)``: True at ``[i, j]`` where rows ``i`` and ``j`` answer one prompt and ``i`` is
    ranked strictly better (``rank[i] < rank[j]``). Ties and rows of different prompts are False."""
    same_prompt = group[:, None] == group[None, :]  # (N, N)
    return same_prompt & (rank[:, None] < rank[None, :])  # (N, N)


def ranking_pairs(group: torch.Tensor, rank: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pairs of a ranking batch as index lists ``(better (P,), worse (P,), prompt (P,))``.

    Row indices of the better and the worse response of each pair and the pair's prompt, in row-major
    order of :func:`ranking_pair_mask`. Its length ``P`` depends on the data, so this reads a count
    back from the device (one host sync); the losses and metrics below use the mask instead.
    """
    better, worse = ranking_pair_mask(group, rank).nonzero(as_tuple=True)  # (P,), (P,)
    return better, worse, group[better]  # (P,) x3


def _per_prompt_sum(values: torch.Tensor, group: torch.Tensor, num_prompts: int) -> torch.Tensor:
    """``(B,)`` sums of an ``(N, N)`` pair table: row ``i``'s entries go to prompt ``group[i]``."""
    rows = torch.arange(num_prompts, device=group.device)  # (B,)
    in_prompt = group[None, :] == rows[:, None]  # (B, N)
    return torch.where(in_prompt, values.sum(1), 0).sum(1)  # (B,)


def ranking_loss(
    scores: torch.Tensor,
    group: torch.Tensor,
    rank: torch.Tensor,
    responses_per_prompt: torch.Tensor,
    weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """InstructGPT's reward-model loss over K ranked responses per prompt (Ouyang et al. 2022, eq. 1).

    Each prompt's loss is the mean of ``-log sigmoid(s_better - s_worse)`` over its pairs (the
    ``1 / C(K, 2)`` of the paper when nothing is tied), so a prompt weighs the same whatever its K;
    the batch loss is the mean over prompts (weighted by ``weight`` when given). A prompt without a
    pair (every response tied) is left out of the mean; a batch without any pair gives NaN.

    With K = 2 and the rows ordered as ``concat_pairs(chosen, rejected)`` (the ranking-batch
    contract), the loss, its gradient and the accuracy are bit for bit those of
    :func:`~rlhf_lit.functional.pairwise_reward_loss`: every sum below adds exact zeros to one term.

    Args:
        scores: ``(N,)`` one reward-model score per row.
        group: ``(N,)`` long, the row's prompt, ``0..B-1``.
        rank: ``(N,)`` the row's rank within its prompt, 0 = best, equal = tie.
        responses_per_prompt: ``(B,)`` K of each prompt; only its length ``B`` is read (no host sync).
        weight: ``(B,)`` per-prompt weights, or None for the plain mean over prompts.

    Returns:
        ``(loss, pair_accuracy)``: 0-dim tensors; the accuracy is the detached fraction of all pairs
        of the batch with ``s_better > s_worse`` (strict: equal scores count as wrong).
    """
    num_prompts = responses_per_prompt.shape[0]
    pairs = ranking_pair_mask(group, rank)  # (N, N)
    diff = scores[:, None] - scores[None, :]  # (N, N) better - worse at [better, worse]
    logsig = torch.where(pairs, F.logsigmoid(diff), 0)  # (N, N), 0 off the pairs
    prompt_pairs = _per_prompt_sum(pairs, group, num_prompts)  # (B,) long
    per_prompt = _per_prompt_sum(logsig, group, num_prompts) / prompt_pairs.clamp(min=1)  # (B,) mean log-sigmoid
    has_pairs = prompt_pairs > 0  # (B,)
    if weight is None:
        # mean over the prompts that have a pair; the factor is exactly 1 when all do (the K = 2 path).
        # (a true division: Python's ``B / tensor`` is ``B * (1 / tensor)``, not exactly 1)
        scale = torch.div(per_prompt.new_tensor(num_prompts), has_pairs.sum())  # ()
        loss = -(per_prompt.mean() * scale)  # ()
    else:
        weight = weight.to(per_prompt.dtype) * has_pairs  # (B,)
        loss = -(per_prompt * weight).sum() / weight.sum()  # ()
    wins = pairs & (scores[:, None] > scores[None, :])  # (N, N)
    accuracy = (wins.sum().to(scores.dtype) / pairs.sum().to(scores.dtype)).detach()  # ()
    return loss, accuracy


class RankingMetrics(NamedTuple):
    """Per-prompt ranking metrics, each ``(B,)``; average them over prompts with ``has_pairs`` as weight."""

    exact: torch.Tensor
    """1.0 where every pair of the prompt is ordered right by the scores (strictly), else 0.0."""
    kendall_tau: torch.Tensor
    """``(concordant - discordant) / pairs`` over the prompt's labelled (untied) pairs."""
    has_pairs: torch.Tensor
    """True where the prompt has a pair (the other two are 1 and 0 there, and mean nothing)."""


def ranking_metrics(
    scores: torch.Tensor, group: torch.Tensor, rank: torch.Tensor, responses_per_prompt: torch.Tensor
) -> RankingMetrics:
    """How well the scores order each prompt's responses: exactly or not, and Kendall's tau.

    Ties in the labels are no pairs: either order of tied responses is right. Kendall's tau is
    taken over the labelled pairs: a pair the scores order the same way is concordant, the other way
    discordant, equal scores neither; ``tau = (concordant - discordant) / pairs``. This is Somers'
    D of the scores given the ranking; it equals tau-a and tau-b when nothing is tied, and with
    K = 2 it is +1, -1 or 0 per pair. Detached, no host sync.

    Args: as :func:`ranking_loss`.
    """
    num_prompts = responses_per_prompt.shape[0]
    with torch.no_grad():
        pairs = ranking_pair_mask(group, rank)  # (N, N)
        concordant = _per_prompt_sum(pairs & (scores[:, None] > scores[None, :]), group, num_prompts)  # (B,)
        discordant = _per_prompt_sum(pairs & (scores[:, None] < scores[None, :]), group, num_prompts)  # (B,)
        count = _per_prompt_sum(pairs, group, num_prompts)  # (B,)
        dtype = scores.dtype
        exact = (concordant == count).to(dtype)  # (B,)
        tau = (concordant - discordant).to(dtype) / count.clamp(min=1).to(dtype)  # (B,)
    return RankingMetrics(exact=exact, kendall_tau=tau, has_pairs=count > 0)

"""BoNBoN: distilling best-of-N sampling into the policy (Gui, Garbacea, Veitch 2024, arXiv:2406.00832).

The data are, per prompt, the best and the worst of N samples of the reference policy ``pi_ref``,
ranked by a reward. With the per-pair log-ratio difference of DPO,

    h = (logps_best - ref_logps_best) - (logps_worst - ref_logps_worst)     # (B,)

(sequence logprobs SUMMED over response tokens, as the derivation needs: it is about whole
responses), the loss is

    L = alpha * (-logps_best) + (1 - alpha) * (h - 1 / (2 beta_N))^2

averaged over pairs: SFT on the best sample (the maximum-likelihood fit of the best-of-N
distribution) plus IPO on the best-worst pair with its target fixed by N.

Why the target: under the best-of-N policy a response's density ratio to the reference is
``N F(r)^(N-1)`` (F the reward's CDF under ``pi_ref``, rewards continuous). ``F(r)`` of a sample
is uniform on (0, 1), so of the best of N it is ``U_(N)``, the largest of N uniforms (Beta(N, 1),
``E log U_(N) = -1/N``) and of the worst ``U_(1)`` (Beta(1, N), ``E log U_(1) = -H_N``). The
expected log-ratio gap of best over worst is therefore

    (N - 1) (E log U_(N) - E log U_(1)) = (N - 1) (H_N - 1/N) = (N - 1) H_(N-1),

``H_k = 1 + 1/2 + ... + 1/k``, and IPO's target ``1 / (2 beta)`` equals it at
``beta_N = 1 / (2 (N - 1) H_(N-1))`` (:func:`bonbon_beta`; N = 2: 1/2, N = 4: 1/11). docs/bonbon.md
writes the derivation out.
"""

from __future__ import annotations

import math

import torch

from rlhf_lit.functional.dpo import implicit_reward_stats, ipo_loss


def bonbon_target(n: int) -> float:
    """``(N - 1) H_(N-1)``: the expected gap ``log pi_N/pi_ref (best) - log pi_N/pi_ref (worst)`` of N samples
    under the best-of-N policy ``pi_N``, IPO's ``1 / (2 beta)`` in BoNBoN (module docstring). N >= 2."""
    check_bonbon_n(n)
    return (n - 1) * math.fsum(1.0 / k for k in range(1, n))


def bonbon_beta(n: int) -> float:
    """``beta_N = 1 / (2 (N - 1) H_(N-1))``, the IPO coefficient BoNBoN derives from N (module docstring)."""
    return 1.0 / (2.0 * bonbon_target(n))


def check_bonbon_n(n: int) -> None:
    """Raise ValueError for an N the derivation does not cover (best and worst of one sample are the same)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an integer >= 2 (the samples best and worst were drawn from), got {n!r}")


def check_bonbon_settings(alpha: float, beta: float | None) -> None:
    """Raise ValueError naming the option for an ``alpha`` outside [0, 1] or a ``beta`` override not > 0."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1] (the weight of the SFT term), got {alpha!r}")
    if beta is not None and not beta > 0:
        raise ValueError(f"beta must be > 0, or null to derive it from n, got {beta!r}")
    if beta == math.inf:  # IPO's target 1 / (2 beta) would be 0 (nothing to prefer), implicit rewards NaN
        raise ValueError("beta must be a finite number, or null to derive it from n, got inf")


def bonbon_loss(
    logps_best: torch.Tensor,
    logps_worst: torch.Tensor,
    ref_logps_best: torch.Tensor,
    ref_logps_worst: torch.Tensor,
    beta: float,
    alpha: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The BoNBoN loss, mean over pairs, and its statistics.

    Args:
        logps_best: ``(B,)`` policy sequence logprobs (sums over response tokens) of the best of N samples;
            with gradient.
        logps_worst: ``(B,)`` the same for the worst of the N; with gradient.
        ref_logps_best: ``(B,)`` the reference's, of the best (constants: the frozen reference).
        ref_logps_worst: ``(B,)`` the reference's, of the worst.
        beta: > 0, IPO's coefficient: :func:`bonbon_beta` of N unless overridden.
        alpha: in [0, 1], the weight of the SFT term.

    Returns:
        ``(loss, stats)``: loss a 0-dim tensor; stats detached 0-dim batch means: those of
        :func:`~rlhf_lit.functional.dpo.dpo_loss` (``rewards_chosen`` / ``rewards_rejected`` of the best and
        the worst, ``reward_accuracy``, ``reward_margin``, ``implicit_kl``), and the two terms before
        weighting, ``sft_loss`` (``-logps_best``) and ``ipo_loss`` (``(h - 1/(2 beta))^2``). No host syncs.
    """
    check_bonbon_settings(alpha, beta)
    best_log_ratio = logps_best - ref_logps_best  # (B,)
    worst_log_ratio = logps_worst - ref_logps_worst  # (B,)
    ipo = ipo_loss(best_log_ratio - worst_log_ratio, beta)  # (B,)
    sft = -logps_best  # (B,)
    loss = (alpha * sft + (1.0 - alpha) * ipo).mean()  # ()
    stats = implicit_reward_stats(best_log_ratio, worst_log_ratio, beta)
    stats.update({"sft_loss": sft.detach().mean(), "ipo_loss": ipo.detach().mean()})
    return loss, stats

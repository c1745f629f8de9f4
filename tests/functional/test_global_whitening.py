"""Whitening over several processes with a reducer: the statistics of the global batch.

The reducer here is a fake all-reduce between threads of this process (:class:`ThreadSum`): each
"rank" runs the function on its own part of a batch, and each call of the reducer returns the sum
of what every rank passed to that call. Expected values are worked by hand (the derivation beside
each literal) or computed in float64 by the test itself; the single-process bit-for-bit checks
compare with the pre-reducer formulas written out here.
"""

from __future__ import annotations

import math
import threading

import pytest
import torch
from torch.testing import assert_close

from rlhf_lit.functional import masked_mean_var, masked_whiten, reinforce_pp_advantages, shape_scores

torch.set_num_threads(1)

T, F = True, False
INF = float("inf")


class ThreadSum:
    """An all-reduce (sum) between ``n`` threads: call ``reducer(rank)`` in rank ``rank``'s thread."""

    def __init__(self, n: int) -> None:
        self.n, self.barrier, self.slots, self.calls = n, threading.Barrier(n, timeout=10), [None] * n, [0] * n

    def reducer(self, rank: int):
        def reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
            self.calls[rank] += 1
            self.slots[rank] = tensor.clone()
            self.barrier.wait()  # every rank has put its part
            total = self.slots[0]
            for part in self.slots[1:]:
                total = total + part  # the same order on every rank: one result everywhere
            self.barrier.wait()  # every rank has read before the next call overwrites
            return total

        return reduce_sum


def on_ranks(fn, parts: list[tuple]) -> list:
    """``fn(*part, reduce_sum)`` for each part in its own thread, with one :class:`ThreadSum`."""
    ranks = ThreadSum(len(parts))
    results, errors = [None] * len(parts), [None] * len(parts)

    def run(rank: int) -> None:
        try:
            results[rank] = fn(*parts[rank], ranks.reducer(rank))
        except BaseException as error:  # noqa: BLE001  re-raised below, in the test's thread
            errors[rank] = error
            ranks.barrier.abort()  # the other rank must not wait for this one

    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(parts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    real = [e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)]
    if real:
        raise real[0]
    return results


# Rank 0 selects 1, 3; rank 1 selects 5, 7 (garbage in the masked-out slots).
X0, M0 = torch.tensor([[1.0, 3.0, INF]]), torch.tensor([[T, T, F]])
X1, M1 = torch.tensor([[5.0, -50.0, 7.0, 0.0]]), torch.tensor([[T, F, T, F]])
# Global: mean (1 + 3 + 5 + 7) / 4 = 4; squared deviations 9 + 1 + 1 + 9 = 20; unbiased var 20 / 3.
S = math.sqrt(20.0 / 3.0)


def mean_var(x, mask, reduce_sum):
    """:func:`masked_mean_var` (unbiased) with the reducer passed by keyword."""
    return masked_mean_var(x, mask, reduce_sum=reduce_sum)


def test_mean_and_variance_are_those_of_every_rank_together():
    (m0, v0), (m1, v1) = on_ranks(mean_var, [(X0, M0), (X1, M1)])
    for mean, var in ((m0, v0), (m1, v1)):
        assert_close(mean, torch.tensor(4.0))
        assert_close(var, torch.tensor(20.0 / 3.0))
    # Each rank alone: mean 2, var 2 (rank 0); mean 6, var 2 (rank 1): not the global statistic.
    assert_close(masked_mean_var(X0, M0), (torch.tensor(2.0), torch.tensor(2.0)))
    (_, biased), _ = on_ranks(lambda x, m, r: masked_mean_var(x, m, unbiased=False, reduce_sum=r), [(X0, M0), (X1, M1)])
    assert_close(biased, torch.tensor(5.0))  # 20 / 4


def test_whitened_over_the_global_batch():
    w0, w1 = on_ranks(lambda x, m, r: masked_whiten(x, m, reduce_sum=r), [(X0, M0), (X1, M1)])
    # (x - 4) / sqrt(20/3) on the counted slots, 0 elsewhere
    assert_close(w0, torch.tensor([[-3.0 / S, -1.0 / S, 0.0]]))
    assert_close(w1, torch.tensor([[1.0 / S, 0.0, 3.0 / S, 0.0]]))
    k0, k1 = on_ranks(lambda x, m, r: masked_whiten(x, m, keep_mean=True, reduce_sum=r), [(X0, M0), (X1, M1)])
    # keep_mean: the global mean 4 added back on the counted slots
    assert_close(k0, torch.tensor([[4 - 3.0 / S, 4 - 1.0 / S, 0.0]]))
    assert_close(k1, torch.tensor([[4 + 1.0 / S, 0.0, 4 + 3.0 / S, 0.0]]))


def test_each_rank_calls_the_reducer_twice_with_float64_parts():
    seen = []

    def recording(tensor):
        seen.append(tensor.dtype)
        return tensor

    masked_whiten(X0, M0, reduce_sum=recording)
    assert seen == [torch.float64, torch.float64]  # (sum, count), then the centered sum of squares


def test_score_whitening_over_the_global_batch():
    ended = torch.tensor([True, True])
    s0, s1 = on_ranks(
        lambda raw, r: shape_scores(raw, ended, bias=1.0, whiten="scores", reduce_sum=r),
        [(torch.tensor([2.0, 4.0]),), (torch.tensor([6.0, 8.0]),)],
    )
    # bias 1 -> 1, 3 | 5, 7: mean 4, unbiased std sqrt(20/3); (s - 4) / (std + 1e-8)
    assert_close(s0, torch.tensor([-3.0 / S, -1.0 / S]))
    assert_close(s1, torch.tensor([1.0 / S, 3.0 / S]))


def test_reinforce_pp_returns_whitened_over_the_global_batch():
    # rank 0: rewards [1, 2] -> returns-to-go [3, 2]; rank 1: [4, garbage (masked)] -> [4, 0].
    # Global valid returns 3, 2, 4: mean 3, unbiased var (0 + 1 + 1) / 2 = 1 -> advantages 0, -1 | 1.
    parts = [
        (torch.tensor([[1.0, 2.0]]), torch.tensor([[T, T]])),
        (torch.tensor([[4.0, 99.0]]), torch.tensor([[T, F]])),
    ]
    (a0, r0), (a1, r1) = on_ranks(lambda rw, m, r: reinforce_pp_advantages(rw, m, 1.0, r), parts)
    assert_close(r0, torch.tensor([[3.0, 2.0]]))
    assert_close(r1, torch.tensor([[4.0, 0.0]]))
    assert_close(a0, torch.tensor([[0.0, -1.0]]))
    assert_close(a1, torch.tensor([[1.0, 0.0]]))


def test_the_count_is_global_so_every_rank_raises_or_none():
    one, none = torch.tensor([[T, F, F]]), torch.tensor([[F, F, F, F]])
    # One token on each rank: two over all, a variance (rank alone: an error).
    (_, var), _ = on_ranks(mean_var, [(X0, one), (X1, torch.tensor([[T, F, F, F]]))])
    assert_close(var, torch.tensor(8.0))  # 1 and 5: mean 3, (4 + 4) / (2 - 1)
    with pytest.raises(ValueError, match="at least 2 masked elements over every process, got 1"):
        on_ranks(mean_var, [(X0, one), (X1, none)])
    with pytest.raises(ValueError, match="no True position over every process"):
        on_ranks(mean_var, [(X0, torch.tensor([[F, F, F]])), (X1, none)])


def _split(x: torch.Tensor, mask: torch.Tensor, rows: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x[:rows], mask[:rows]), (x[rows:], mask[rows:])]


def test_two_ranks_equal_the_whole_batch_to_float32_rounding():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 11, generator=g) * 3 + 1.5  # (8, 11)
    mask = torch.rand(8, 11, generator=g) < 0.7  # (8, 11)
    mask[:3] = torch.arange(11) < 2  # rank 0's rows are short: the ranks hold different token counts
    x64, m = x.double(), mask
    mean = x64[m].mean()
    var = ((x64[m] - mean) ** 2).sum() / (m.sum() - 1)
    expected = torch.where(m, (x64 - mean) / torch.sqrt(var + 1e-8), 0.0).float()  # float64, by the formula
    w0, w1 = on_ranks(lambda xx, mm, r: masked_whiten(xx, mm, reduce_sum=r), _split(x, mask, 3))
    assert_close(torch.cat([w0, w1]), expected, rtol=4e-7, atol=4e-7)
    per_rank = torch.cat([masked_whiten(*part) for part in _split(x, mask, 3)])
    assert (per_rank - expected).abs().max() > 0.1  # whitening each rank by its own is another result


def test_one_process_is_the_single_process_formula_bit_for_bit():
    """An identity reducer (one process under a strategy) changes no bit of the result."""
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        x = torch.randn(6, 9, generator=g) * 5 - 2  # (6, 9)
        mask = torch.rand(6, 9, generator=g) < 0.6  # (6, 9)
        mask[0, :2] = True
        zero = torch.zeros(())
        # the formula before reducers: masked mean, then the centered sum of squares, in float32
        count = mask.sum()
        mean = torch.where(mask, x, zero).sum() / count
        var = torch.where(mask, (x - mean) ** 2, zero).sum() / count
        var = var * count / (count - 1)
        before = torch.where(mask, (x - mean) * torch.rsqrt(var + 1e-8), zero)
        assert torch.equal(masked_whiten(x, mask, reduce_sum=lambda t: t), before)
        assert torch.equal(masked_whiten(x, mask), before)
        scores = x[0]  # (9,)
        one = shape_scores(scores, torch.ones(9, dtype=torch.bool), whiten="scores", reduce_sum=lambda t: t)
        assert torch.equal(one, shape_scores(scores, torch.ones(9, dtype=torch.bool), whiten="scores"))
        # torch.std reduces in another order: the same whitened scores to a float32 ulp or two
        assert_close(one, (scores - scores.mean()) / (scores.std() + 1e-8), rtol=3e-7, atol=3e-7)

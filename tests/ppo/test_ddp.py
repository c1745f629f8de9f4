"""PPO under DDP (2 CPU processes, gloo): ranks sample differently, stay in sync, share one KL
coefficient, whiten over the rows of both ranks, and count the data position and the logged
metrics over both."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ppo_helpers import worker_env

HERE = Path(__file__).resolve().parent


def _run_worker(out: Path, forward: str) -> list[dict]:
    result = subprocess.run(
        [sys.executable, str(HERE / "ddp_worker.py"), str(out), forward],
        capture_output=True, text=True, timeout=900, env=worker_env(), cwd=out,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return _run_worker(tmp_path_factory.mktemp("ddp"), "eager")


def _whitened_over_both(parts: list[torch.Tensor], masks: list[torch.Tensor], keep_mean: bool) -> list[torch.Tensor]:
    """Each part whitened with the mean and unbiased variance of the masked values of ALL parts
    (float64, by the formula), + 1e-8 under the square root as the code documents."""
    values = torch.cat([p.double()[m] for p, m in zip(parts, masks)])
    mean, var = values.mean(), values.var(correction=1)
    out = []
    for p, m in zip(parts, masks):
        w = (p.double() - mean) / torch.sqrt(var + 1e-8) + (mean if keep_mean else 0.0)
        out.append(torch.where(m, w, 0.0).float())
    return out


@pytest.mark.slow
def test_ddp_ranks_sample_differently_and_stay_in_sync(ranks):
    rank0, rank1 = ranks
    assert rank0["rollouts"] == rank1["rollouts"] == 3
    # Same prompts on both ranks, per-rank seeds: the samples differ (N details #14).
    assert not torch.equal(rank0["first_responses"], rank1["first_responses"])
    # DDP averages gradients, so both ranks hold identical policies after 3 rollouts ...
    for name, value in rank0["policy"].items():
        torch.testing.assert_close(value, rank1["policy"][name], rtol=0, atol=0, msg=name)
    # ... that did move away from the start.
    moved = sum(float((rank0["policy"][k] - rank0["initial"][k]).abs().sum()) for k in rank0["policy"])
    assert moved > 0
    # The adaptive controller is fed the KL averaged over ranks, so the coefficients agree and
    # have moved off the initial 0.1 (tiny_module's init_coef).
    assert rank0["kl_coef"] == rank1["kl_coef"] != 0.1
    # Exactly: each rollout the controller gets the per-response KL (summed over tokens) averaged
    # over BOTH ranks and the global sample count 2 x 4, and applies Ziegler et al.'s eq. 2 with
    # tiny_module's target 1 and horizon 100.
    assert rank0["controller"] == rank1["controller"]
    for k, (kl_fed, n_steps, value_before) in enumerate(rank0["controller"]):
        assert kl_fed == pytest.approx((rank0["local_kl"][k] + rank1["local_kl"][k]) / 2, rel=1e-5, abs=1e-6)
        assert rank0["local_kl"][k] != pytest.approx(rank1["local_kl"][k], rel=1e-3) or k == 0
        assert n_steps == 8
        error = min(max(kl_fed / 1.0 - 1.0, -0.2), 0.2)
        value_after = rank0["controller"][k + 1][2] if k + 1 < 3 else rank0["kl_coef"]
        assert value_after == pytest.approx(value_before * (1 + error * 8 / 100), rel=1e-12)


@pytest.mark.slow
def test_reward_and_reinforce_pp_whitening_use_the_rows_of_both_ranks(ranks):
    """``reward.whiten: rewards`` then REINFORCE++'s return whitening, each over both ranks' tokens
    (``ppo.whiten_scope: global``); float32 against the float64 formula (values of order 1)."""
    for k in range(3):
        masks = [r["rollout"][k]["response_mask"] for r in ranks]
        rewards = _whitened_over_both([r["shaped_rewards"][k] for r in ranks], masks, keep_mean=True)
        advantages = _whitened_over_both([r["rollout"][k]["returns"] for r in ranks], masks, keep_mean=False)
        for rank, r in enumerate(ranks):
            torch.testing.assert_close(r["rollout"][k]["rewards"], rewards[rank], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(r["rollout"][k]["advantages"], advantages[rank], rtol=1e-5, atol=1e-6)
            # returns-to-go of the whitened rewards (gamma 1): the sum from each token to the end
            valid = torch.where(masks[rank], r["rollout"][k]["rewards"], 0.0)
            to_go = valid.flip(1).cumsum(1).flip(1)
            torch.testing.assert_close(r["rollout"][k]["returns"], torch.where(masks[rank], to_go, 0.0))


@pytest.mark.slow
def test_data_position_and_logged_metrics_count_both_ranks(ranks):
    # Each rollout used 4 prompts on each of 2 ranks: the global position moves by 8 (both report it).
    assert ranks[0]["consumed"] == ranks[1]["consumed"] == [8, 8, 8]
    for k in range(3):
        logged = [r["logged"][k] for r in ranks]
        local = [r["rollout"][k] for r in ranks]
        # Metrics are means over the ranks (equal rows per rank: the means over the global batch).
        score = sum(float(x["raw_scores"].mean()) for x in local) / 2
        length = sum(float(x["response_mask"].sum(1).float().mean()) for x in local) / 2
        kl = sum(r["local_kl"][k] for r in ranks) / 2
        for metrics in logged:
            assert metrics["objective/scores"] == pytest.approx(score, rel=1e-6, abs=1e-7)
            assert metrics["response/length"] == pytest.approx(length, rel=1e-6)
            assert metrics["objective/kl"] == pytest.approx(kl, rel=1e-5, abs=1e-6)
            # tokens per second counts the responses of both ranks: length x 8 rows over the phases' time
            seconds = sum(v for name, v in metrics.items() if name.startswith("time/") and name != "time/tokens_per_s")
            assert metrics["time/tokens_per_s"] == pytest.approx(metrics["response/length"] * 8 / seconds, rel=1e-6)
        assert {n: v for n, v in logged[0].items() if not n.startswith("time/")} == {
            n: v for n, v in logged[1].items() if not n.startswith("time/")}  # one reduced value on both ranks


@pytest.mark.slow
def test_ddp_with_compiled_passes_stays_in_sync_and_scores_as_eager(ranks, tmp_path):
    compiled = _run_worker(tmp_path, "compiled")
    for rank in (0, 1):
        assert compiled[rank]["compile_graphs"] >= 2 and ranks[rank]["compile_graphs"] == 0  # it ran compiled
        # The same seeds and eager generation: the first rollout samples the same tokens, and its
        # scoring (compiled, no grad) gives the eager rollout's KL and scores within float rounding.
        assert torch.equal(compiled[rank]["first_responses"], ranks[rank]["first_responses"])
        first, eager_first = compiled[rank]["logged"][0], ranks[rank]["logged"][0]
        for key in ("objective/kl", "objective/scores", "loss/policy"):
            assert first[key] == pytest.approx(eager_first[key], rel=1e-4, abs=1e-6), key
    for name, value in compiled[0]["policy"].items():  # DDP's averaged gradients: identical ranks
        torch.testing.assert_close(value, compiled[1]["policy"][name], rtol=0, atol=0, msg=name)
    moved = sum(float((compiled[0]["policy"][k] - compiled[0]["initial"][k]).abs().sum()) for k in compiled[0]["policy"])
    assert moved > 0

"""PPO under DDP (2 CPU processes, gloo): ranks sample differently, stay in sync, share one KL
coefficient, whiten over the rows of both ranks, and count the data position and the logged
metrics over both; and the same run with its passes compiled. Both run stories260K cut to 2 of its 5
decoder layers (``OUT/stories-2-layers``, tests/ppo/two_process_worker.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from float32_bounds import logprob_bound, summed_bound, whitened_bound
from transformers import AutoModelForCausalLM

from rlhf_lit.models.compiled_passes import bucket_length


def _ranks(out: Path) -> list[dict]:
    """What each rank of a ddp_worker.py part of the two-process launch (``two_process_run``) wrote."""
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


@pytest.fixture(scope="module")
def ranks(two_process_run):
    return _ranks(two_process_run / "ddp")


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
            n: v for n, v in logged[1].items() if not n.startswith("time/")
        }  # one reduced value on both ranks


@pytest.mark.slow
@pytest.mark.kernels
def test_ddp_with_compiled_passes_stays_in_sync_and_scores_as_eager(ranks, two_process_run):
    """The first rollout samples the same tokens (generation is eager in both runs); its scoring pass,
    compiled, differs from the eager one by float32 summation order only, within the bounds of
    tests/float32_bounds.py derived below from the logits' magnitude and the number of tokens summed.
    (The update is not compared here: after Adam's first step a gradient component near zero may flip
    sign under another summation order and move a weight by a full learning rate; the compiled update
    is checked step by step against the independent loop in test_golden_rollout.py.)"""
    compiled = _ranks(two_process_run / "ddp-compiled")
    policy = AutoModelForCausalLM.from_pretrained(two_process_run / "stories-2-layers").eval()
    assert policy.config.num_hidden_layers == 2
    beta = 0.1  # tiny_module's init_coef: the first rollout's KL coefficient
    for rank in (0, 1):
        assert compiled[rank]["compile_graphs"] >= 2 and ranks[rank]["compile_graphs"] == 0  # it ran compiled
        assert torch.equal(compiled[rank]["first_responses"], ranks[rank]["first_responses"])
    got = [c["rollout"][0] for c in compiled]
    eager = [r["rollout"][0] for r in ranks]
    masks = [e["response_mask"] for e in eager]
    logit_magnitude = max(_largest_logit(policy, e["query_responses"], e["attention_mask"]) for e in eager)
    width = eager[0]["query_responses"].shape[1]
    prompt_length = width - masks[0].shape[1]
    # The compiled pass sums over its rows padded to buckets: that many positions.
    positions = bucket_length(prompt_length) + bucket_length(width - prompt_length)
    per_token = logprob_bound(policy.config, logit_magnitude, positions)  # ~2.5e-4 nats at |logit| ~23
    longest = max(int(m.sum(1).max()) for m in masks)
    for rank in (0, 1):
        # The reward model is not compiled: the same tokens through the same eager pass, bit for bit.
        assert torch.equal(got[rank]["raw_scores"], eager[rank]["raw_scores"])
        # Old logprobs (compiled policy) and the KL to the eager reference: per token, the logprob bound.
        torch.testing.assert_close(
            got[rank]["old_logprobs"][masks[rank]], eager[rank]["old_logprobs"][masks[rank]], rtol=0, atol=per_token
        )
        torch.testing.assert_close(got[rank]["kl"], eager[rank]["kl"], rtol=0, atol=per_token)
        # objective/kl: a mean over rows of the per-token KL summed over at most `longest` tokens.
        kl, eager_kl = compiled[rank]["logged"][0]["objective/kl"], ranks[rank]["logged"][0]["objective/kl"]
        assert abs(kl - eager_kl) <= summed_bound(per_token, longest), (kl, eager_kl)
    # The advantages, through the chain REINFORCE++ with reward whitening takes (each over both ranks):
    # shaped reward -beta * kl (+ the identical score) -> whitened -> returns to go -> whitened.
    shaped = torch.cat([r["shaped_rewards"][0][m] for r, m in zip(ranks, masks)])
    rewards_bound = whitened_bound(shaped, beta * per_token) + beta * per_token  # + the mean put back (keep_mean)
    returns = torch.cat([e["returns"][m] for e, m in zip(eager, masks)])
    advantages_bound = whitened_bound(returns, summed_bound(rewards_bound, longest))
    for rank in (0, 1):
        torch.testing.assert_close(got[rank]["advantages"], eager[rank]["advantages"], rtol=0, atol=advantages_bound)
    for name, value in compiled[0]["policy"].items():  # DDP's averaged gradients: identical ranks
        torch.testing.assert_close(value, compiled[1]["policy"][name], rtol=0, atol=0, msg=name)
    moved = sum(
        float((compiled[0]["policy"][k] - compiled[0]["initial"][k]).abs().sum()) for k in compiled[0]["policy"]
    )
    assert moved > 0


def _largest_logit(policy, ids: torch.Tensor, attention_mask: torch.Tensor) -> float:
    """The largest |logit| of the eager policy on left-padded rows (positions from the mask)."""
    positions = (attention_mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        return float(policy(input_ids=ids, attention_mask=attention_mask, position_ids=positions).logits.abs().max())

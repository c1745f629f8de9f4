"""PPO on 2 CPU processes under ddp and fsdp2 against one process on the same global batch.

strategy_worker.py runs one greedy rollout and one update (a policy and a critic optimizer step)
on 8 prompts: in one process, or split over 2 where rank 0's responses end after 3-8 tokens and
rank 1's run to the full 10 (the ranks stop generating at different steps and hold different
numbers of tokens: under FSDP every forward pass is a collective, so this would hang if a rank
stopped stepping early). The update must be the single process's: scores and advantages are
whitened over the rows of both ranks (``ppo.whiten_scope: global``) and the loss is the token mean
over the minibatch of all ranks, so the reduced gradients equal the single run's. Under ddp the
compiled decode path (``sampling.decode: compiled``) draws the eager tokens on each rank.
"""

from __future__ import annotations

from pathlib import Path

import golden_reference as ref
import pytest
import torch
from float32_bounds import (
    EPS,
    adam_first_step_bound,
    clipped_bound,
    gradient_bound,
    largest_logit,
    logprob_bound,
    output_bound,
    weighted_abs_grads,
    whitened_bound,
)
from ppo_helpers import tiny_module
from transformers import AutoModelForCausalLM


def _run(out: Path) -> dict[int, dict]:
    """What each rank of a strategy_worker.py part of the two-process launch (``two_process_run``) wrote
    (a hung part fails the launch: a rank waited in a collective for a rank that had stopped)."""
    return {r: torch.load(p, weights_only=False) for r in (0, 1) if (p := out / f"rank{r}.pt").exists()}


LR, ADAM_EPS = 1e-5, 1e-8  # OptimizerConfig's defaults, which tiny_module keeps
BETA, LAM, VF_COEF = 0.05, 0.95, 0.1  # strategy_worker's fixed KL coefficient; PPOConfig's lambda and vf_coef


def _assert_within(got: torch.Tensor, wanted: torch.Tensor, bound: torch.Tensor | float, what: str) -> None:
    """Every entry of ``got`` within ``bound`` (a tensor of per-entry bounds, or one) of ``wanted``."""
    difference = (got - wanted).abs()
    excess = difference - bound
    worst = int(excess.argmax())
    limit = float(bound.flatten()[worst]) if isinstance(bound, torch.Tensor) else bound
    assert (excess <= 0).all(), f"{what}: |difference| {float(difference.flatten()[worst]):.3g} > bound {limit:.3g}"


def _bounds(single: dict) -> dict:
    """How far the 2-process run's rollout, losses and loss weights may be from the single run's:
    the models read the same rows padded to other widths (another summation order), so each model
    output moves within tests/float32_bounds.py's bound at its magnitude, carried through the
    formulas: the KL (old - ref logprob: two logprob bounds), the score whitened over the 8 rows,
    the shaped reward (beta * KL + score), GAE (gamma 1, lambda 0.95: at most R deltas, each the
    reward's bound plus two values'), the advantages whitened over all tokens; the losses at ratio
    1 (the first minibatch of the first epoch: the weights that scored the rollout) and the
    per-token moves of the gradients' loss weights (``moves``, :func:`weighted_abs_grads` of the
    single run's rows on the initial models: ``grad logprob_t`` weighted by ``A_t``'s move,
    ``grad value_t`` by vf_coef times ``(value - return)``'s)."""
    rs = single["rollout"]
    ids, attention, mask = rs["query_responses"], rs["attention_mask"], rs["response_mask"]
    module = tiny_module()  # the worker's initial policy and critic (tiny_module seeds the critic's head)
    config, positions = module.policy.config, ids.shape[1]
    lp = logprob_bound(config, largest_logit(module.policy, ids, attention), positions)
    value = output_bound(config, float(rs["old_values"].abs().max()), positions)
    raw = output_bound(config, float(rs["raw_scores"].abs().max()), positions)
    scores = whitened_bound(rs["raw_scores"], raw) + raw  # keep_mean: the mean put back moves too
    longest = int(mask.sum(1).max())
    gae = sum(LAM**k for k in range(longest)) * (BETA * 2 * lp + scores + 2 * value)
    advantages_raw = (rs["returns"] - rs["old_values"])[mask]
    advantages = whitened_bound(advantages_raw, gae)
    returns = gae + value
    tokens = int(mask.sum())
    adv = rs["advantages"][mask]
    errors = (rs["old_values"] - rs["returns"])[mask].abs()
    bounds = {
        "raw_scores": raw,
        "scores": scores,
        "advantages": advantages,
        "policy": float((adv.abs() * 2 * lp * 1.01 + advantages * 1.01).mean()) + 8 * EPS,
        "value": float((errors * (2 * value + returns)).mean()) + 8 * EPS * float((0.5 * errors**2).mean()),
    }
    # Per token, the unpadded row through the initial models, as a reference would (never rlhf_lit's passes).
    prompt_width = ids.shape[1] - rs["response_ids"].shape[1]
    policy_terms, critic_terms = [], []
    for row in range(ids.shape[0]):
        prompt = ids[row, :prompt_width][attention[row, :prompt_width].bool()].tolist()
        response = rs["response_ids"][row][mask[row]].tolist()
        logprobs, _ = ref.response_logprobs_and_entropy(module.policy, prompt, response, 1.0)
        values = ref.token_values(module.critic.model, prompt, response, 0.0)
        for t in range(len(response)):
            a = float(rs["advantages"][row, t])
            policy_terms.append((logprobs[t], (abs(a) * 2 * lp * 1.01 + advantages * 1.01) / tokens))
            critic_terms.append((values[t], VF_COEF * (2 * value + returns) / tokens))
    policy_moves = weighted_abs_grads(module.policy, policy_terms)
    critic_moves = weighted_abs_grads(module.critic, critic_terms)
    bounds["moves"] = [
        {"policy." + n: m for n, m in policy_moves.items()},
        {"critic." + n: m for n, m in critic_moves.items()},
    ]
    bounds["positions"] = tokens * positions
    return bounds


def _gradient_bounds(grads: dict[str, torch.Tensor], bounds: dict, moves: dict[str, torch.Tensor]) -> dict:
    """Per entry: the backward's own summation order (:func:`gradient_bound` at the largest entry of
    this optimizer's gradient) plus the loss weights' moves (``_bounds``)."""
    scale = max(float(g.abs().max()) for g in grads.values())
    config = tiny_module().policy.config
    backward = gradient_bound(config, scale, bounds["positions"])
    return {n: backward + moves[n] for n in grads}


@pytest.fixture(scope="module")
def single(two_process_run):
    return _run(two_process_run / "single")[0]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_two_processes_make_the_single_process_update(mode, single, two_process_run):
    ranks = _run(two_process_run / f"strategy-{mode}")
    rank0, rank1 = ranks[0], ranks[1]
    # The ranks generated the single run's responses, and stopped at different lengths.
    width0, width1 = rank0["responses"][0].shape[1], rank1["responses"][0].shape[1]
    assert width0 == 8 < width1 == 10
    assert torch.equal(rank0["responses"][0], single["responses"][0][:4, :width0])
    assert torch.equal(rank1["responses"][0], single["responses"][0][4:, :width1])
    assert torch.equal(single["responses"][0][:4, width0:], torch.zeros(4, 2, dtype=torch.long))  # pad after EOS

    # Whitening is over both ranks' rows (ppo.whiten_scope: global): the scores and advantages each
    # rank holds are the single run's rows, within the bounds of another summation order (the
    # models read rows padded to other widths: ``_bounds``); whitening each rank's rows by its own
    # would move the scores by up to 0.77.
    (r0, r1, rs) = (rank0["rollout"], rank1["rollout"], single["rollout"])
    bounds = _bounds(single)
    both = torch.cat([r0["raw_scores"], r1["raw_scores"]])
    torch.testing.assert_close(both, rs["raw_scores"], rtol=0, atol=bounds["raw_scores"])
    torch.testing.assert_close(torch.cat([r0["scores"], r1["scores"]]), rs["scores"], rtol=0, atol=bounds["scores"])
    assert torch.equal(rs["response_mask"][:4, :width0], r0["response_mask"])
    torch.testing.assert_close(r0["advantages"], rs["advantages"][:4, :width0], rtol=0, atol=bounds["advantages"])
    torch.testing.assert_close(r1["advantages"], rs["advantages"][4:], rtol=0, atol=bounds["advantages"])

    # Losses: each rank's token mean, weighted by its tokens, is the single run's token mean.
    (mb0,), (mb1,), (mbs,) = rank0["minibatches"], rank1["minibatches"], single["minibatches"]
    assert mb0["tokens"] + mb1["tokens"] == mbs["tokens"] and mb0["tokens"] < mb1["tokens"]
    for loss in ("policy", "value"):
        pooled = (mb0[loss] * mb0["tokens"] + mb1[loss] * mb1["tokens"]) / mbs["tokens"]
        assert abs(pooled - mbs[loss]) <= bounds[loss], (loss, pooled, mbs[loss], bounds[loss])
        assert (mb0[loss] + mb1[loss]) / 2 != pytest.approx(mbs[loss], rel=1e-2)  # an unweighted mean would not be

    # Gradients after the all-reduce (ddp) or reduce-scatter (fsdp2): the single run's, both optimizers,
    # each entry within the backward's own bound plus what its loss weights' bounds move it by.
    assert len(rank0["grads"]) == len(single["grads"]) == 2
    grad_bounds = [_gradient_bounds(gs, bounds, moves) for gs, moves in zip(single["grads"], bounds["moves"])]
    for step, (g0, g1, gs) in enumerate(zip(rank0["grads"], rank1["grads"], single["grads"])):
        assert g0.keys() == gs.keys()
        for name in gs:
            assert torch.equal(g0[name], g1[name]), (step, name)  # one gradient on both ranks
            _assert_within(g0[name], gs[name], grad_bounds[step][name], f"step {step} gradient {name}")

    # Clipped to the norm of the whole gradient, not of each rank's shard: the single run's again.
    clipped_bounds = []
    for step, (c0, cs, gs) in enumerate(zip(rank0["clipped"], single["clipped"], single["grads"])):
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in gs.values()]))
        assert norm > 0.02 * 1.5, step  # the clip is active
        clipped_bounds.append(clipped_bound(gs, grad_bounds[step], 0.02))
        for name in cs:
            # the single run's own clip: one product per entry (a few eps of it)
            torch.testing.assert_close(cs[name], gs[name] * (0.02 / (norm + 1e-6)), rtol=4 * EPS, atol=0)
            _assert_within(c0[name], cs[name], clipped_bounds[step][name], f"step {step} clipped {name}")

    # After the update: one policy on both ranks, the single run's; Adam's first step is
    # lr * g / (|g| + eps), which moves with g as :func:`adam_first_step_bound` derives.
    policy = rank0["policy"]
    if mode == "ddp":
        for name, value in policy.items():
            assert torch.equal(value, rank1["policy"][name]), name
    else:  # each rank held half of the policy; rank 0 gathered it whole
        assert rank0["own_numel"] + rank1["own_numel"] == rank0["full_numel"]
        assert rank0["own_numel"] < rank0["full_numel"]
    clipped = {n.removeprefix("policy."): (single["clipped"][0][n], b) for n, b in clipped_bounds[0].items()}
    for name, value in single["policy"].items():
        # stories260K ties its LM head to the embedding: one parameter, two state-dict entries
        grad, bound = clipped[name if name in clipped else "model.embed_tokens.weight"]
        # + 4 eps of the weight: the update's own float32 rounding (one subtraction, one product)
        _assert_within(
            policy[name],
            value,
            adam_first_step_bound(grad, bound, LR, ADAM_EPS) + 4 * EPS * value.abs(),
            f"updated {name}",
        )
    assert any(not torch.equal(policy[n], v) for n, v in single["policy"].items())

    # The export (rank 0) is the whole updated policy, loadable by plain transformers.
    exported = AutoModelForCausalLM.from_pretrained(two_process_run / f"strategy-{mode}" / "export").state_dict()
    for name, value in policy.items():
        assert torch.equal(exported[name], value), name


@pytest.mark.slow
@pytest.mark.kernels
def test_compiled_decoding_under_ddp_draws_the_eager_tokens_on_each_rank(single, two_process_run):
    """``sampling.decode: compiled`` under ddp: each process compiles its own decode step (one graph,
    the rollout's batch size), draws the tokens the eager path draws in the same process, and the
    logged ``compile/decode_graphs`` says so (mean over the ranks). (fsdp2 is refused:
    tests/cli/test_compiled_decode_cli.py.)"""
    ranks = _run(two_process_run / "strategy-ddp-compiled")
    for rank, record in ranks.items():
        (compiled,), (eager,) = record["responses"], record["eager_responses"]
        assert torch.equal(compiled, eager), rank
        assert record["compile_stats"]["graphs"] == 1 and record["compile_stats"]["calls"] == 1, rank
        assert record["metrics"]["compile/decode_graphs"] == 1.0
        assert record["metrics"]["compile/decode_s"] > 0
    # and the eager single process's responses: rank 0 the 4 shortest, rank 1 the rest
    width0 = ranks[0]["responses"][0].shape[1]
    assert torch.equal(ranks[0]["responses"][0], single["responses"][0][:4, :width0])
    assert torch.equal(ranks[1]["responses"][0], single["responses"][0][4:])

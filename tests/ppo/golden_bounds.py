"""The bounds of the golden-rollout test (test_golden_rollout.py): how far each quantity of the module
may be from the loop reference when only the order of float32 sums differs (a padded batch, eager or
compiled, against unpadded rows), derived from tests/float32_bounds.py and carried through the
formulas: the rollout's tensors, each minibatch's losses, and the gradients' entries."""

from __future__ import annotations

import torch
from float32_bounds import (
    EPS,
    entropy_bound,
    gradient_bound,
    largest_logit,
    logprob_bound,
    output_bound,
    weighted_abs_grads,
    whitened_bound,
)

from rlhf_lit.models.compiled_passes import bucket_length
from rlhf_lit.stages.ppo_config import PPOConfig


def _flat(rows: list[list[float]]) -> list[float]:
    return [x for row in rows for x in row]


def rollout_bounds(
    policy, reference, rollout, expected: dict, beta: float, ppo: PPOConfig, temperature: float
) -> dict[str, float]:
    """How far each rollout quantity may be from the loop reference (another summation order, no
    bug), carried through the formulas from the models' outputs (tests/float32_bounds.py), on rows
    of :func:`positions_of` tokens:

    - logprobs: the per-token bound at the largest |logit| / temperature of the policy (ref_logprobs:
      of the reference) on these rows; values, scores: the output bound at their largest |value|;
    - kl = logprob - ref_logprob: the two bounds added; rewards = -beta * kl (+ the score): beta
      times that, plus the score's bound;
    - GAE: delta_t = r_t + gamma V_(t+1) - V_t moves by at most r + (1 + gamma) v, and the advantage
      sums (gamma lambda)^k of at most R of them; returns add v;
    - the advantages whitened over all 16 tokens (:func:`whitened_bound` of the raw ones).
    Each also gets 8 eps of its own magnitude for the float32 arithmetic after the networks."""
    ids, mask = rollout.query_responses, rollout.attention_mask
    config, positions = policy.config, positions_of(rollout)  # the reward model is the same stories260K trunk
    lp = logprob_bound(config, largest_logit(policy, ids, mask, temperature), positions)
    ref_lp = logprob_bound(config, largest_logit(reference, ids, mask, temperature), positions)
    value = output_bound(config, max(abs(v) for v in _flat(expected["values"])), positions)
    score = output_bound(config, max(abs(s) for s in expected["raw_scores"]), positions)
    kl = lp + ref_lp
    rewards = beta * kl + score
    discount = sum((ppo.gamma * ppo.lam) ** k for k in range(rollout.response_ids.shape[1]))
    advantage = (rewards + (1 + ppo.gamma) * value) * discount
    raw_advantages = torch.tensor([r - v for r, v in zip(_flat(expected["returns"]), _flat(expected["values"]))])
    bounds = {
        "logprobs": lp,
        "ref_logprobs": ref_lp,
        "values": value,
        "raw_scores": score,
        "scores": score,
        "kl": kl,
        "rewards": rewards,
        "returns": advantage + value,
        "adv": whitened_bound(raw_advantages, advantage),
    }
    for key in bounds:
        values = expected[key] if key in ("raw_scores", "scores") else _flat(expected[key])
        bounds[key] += 8 * EPS * max(abs(x) for x in values)
    return bounds


def positions_of(rollout) -> int:
    """The longest rows the module's passes sum over: the rollout's prompt and response columns,
    each padded to its bucket when the passes are compiled (16 + 16 here; more than eager's width)."""
    response_length = rollout.response_ids.shape[1]
    prompt_length = rollout.query_responses.shape[1] - response_length
    return bucket_length(prompt_length) + bucket_length(response_length)


def policy_term_bound(token: dict, d_log_ratio: float, d_advantage: float, clip_range: float) -> float:
    """How far ``max(-A r, -A clip(r))`` moves when ``log r`` moves by ``d_log_ratio`` and ``A`` by
    ``d_advantage``: ``-A r`` by ``|A| dr + r dA`` (``dr = r d_log_ratio``, x 1.01 for the second
    order); ``-A clip(r)`` by ``clip(r) dA``, plus ``|A| dr`` if ``r`` is within ``dr`` of the clip
    range (outside it the clipped term does not move with ``r``). The larger term's move, unless the
    other can overtake it (then the larger move of the two)."""
    a, r, eps = token["advantage"], token["ratio"], clip_range
    dr = r * d_log_ratio * 1.01
    clipped = min(max(r, 1 - eps), 1 + eps)
    unclipped_term, clipped_term = -a * r, -a * clipped
    d_unclipped = abs(a) * dr + r * d_advantage
    d_clipped = clipped * d_advantage + (abs(a) * dr if 1 - eps - dr < r < 1 + eps + dr else 0.0)
    if abs(unclipped_term - clipped_term) > d_unclipped + d_clipped:  # the max keeps its branch
        return d_unclipped if unclipped_term > clipped_term else d_clipped
    return max(d_unclipped, d_clipped)


def policy_weight_error(token: dict, d_log_ratio: float, d_advantage: float, clip_range: float) -> float:
    """How far the weight of ``grad logprob`` in the policy term's gradient (``-A r`` while the
    unclipped branch is taken or ``r`` is inside the clip range, else 0) moves:
    ``r (|A| d_log_ratio x 1.01 + dA)`` where the gradient is not 0 (or may stop being 0)."""
    a, r, eps = token["advantage"], token["ratio"], clip_range
    dr = r * d_log_ratio * 1.01
    clipped = min(max(r, 1 - eps), 1 + eps)
    unclipped_taken = -a * r >= -a * clipped - (abs(a) * dr + 2 * r * d_advantage)
    inside = 1 - eps - dr < r < 1 + eps + dr
    return r * (abs(a) * d_log_ratio * 1.01 + d_advantage) if unclipped_taken or inside else 0.0


def weight_errors(policy, critic, per_token, rollout_bounds, d_log_ratio, value_bound, ppo: PPOConfig):
    """What the loop's gradient would move by if the loss weights it takes from the rollout moved
    within their bounds (the advantages, old logprobs, returns, old values) and the current
    logprobs and values within theirs: for the policy, :func:`policy_weight_error` per token on
    ``|grad logprob_t|``; for the critic, ``|v - R|``'s move ``dv + dR`` (+ the old value's for the
    clipped branch) on ``|grad v_t|``; each times the loss's own factor (the token mean, vf_coef,
    1 / grad_accum). The move of the summation order itself is :func:`gradient_bound`'s."""
    tokens, _ = per_token
    scale = 1.0 / (len(tokens) * ppo.grad_accum)
    d_advantage = rollout_bounds["adv"]
    policy_weights = [
        (t["logprob_out"], scale * policy_weight_error(t, d_log_ratio, d_advantage, ppo.clip_range)) for t in tokens
    ]
    d_value = value_bound + rollout_bounds["returns"] + rollout_bounds["values"]
    critic_weights = [(t["value_out"], scale * ppo.vf_coef * d_value) for t in tokens]
    return weighted_abs_grads(policy, policy_weights), weighted_abs_grads(critic, critic_weights)


def loss_bounds(
    policy, rollout, ptx_batch, per_token, rollout_bounds, ppo: PPOConfig, temperature: float, reward_offset: float
) -> dict[str, float]:
    """How far a minibatch's losses may be from the loop's (another summation order), each a mean
    over tokens of its term's move (:func:`policy_term_bound`; the value term
    ``0.5 max((v - R)^2, (v_clip - R)^2)`` by ``|v - R| (dv + dR)`` per branch, ``dv`` the value's
    bound at this step's weights plus the old value's for the clipped one), the entropy by
    :func:`entropy_bound`, PPO-ptx by the logprob bound of its own rows (temperature 1), and the total
    by the sum of those times their coefficients."""
    tokens, largest_entropy = per_token
    config, positions = policy.config, positions_of(rollout)
    magnitude = largest_logit(policy, rollout.query_responses, rollout.attention_mask, temperature)
    d_log_ratio = logprob_bound(config, magnitude, positions) + rollout_bounds["logprobs"]
    terms = [policy_term_bound(t, d_log_ratio, rollout_bounds["adv"], ppo.clip_range) for t in tokens]
    policy_bound = sum(terms) / len(tokens)
    value = output_bound(config, max(abs(t["value"]) for t in tokens) + abs(reward_offset), positions)
    d_return = rollout_bounds["returns"]
    value_bound = sum(
        max(
            abs(t["value"] - t["return"]) * (value + d_return),
            abs(t["value_clipped"] - t["return"]) * (value + rollout_bounds["values"] + d_return),
        )
        for t in tokens
    ) / len(tokens)
    entropy = entropy_bound(config, magnitude, largest_entropy, positions)
    ptx_magnitude = largest_logit(policy, ptx_batch["input_ids"], ptx_batch["attention_mask"])
    ptx = logprob_bound(config, ptx_magnitude, ptx_batch["input_ids"].shape[1])
    bounds = {"loss/policy": policy_bound, "loss/value": value_bound, "policy/entropy": entropy, "loss/ptx": ptx}
    bounds["loss"] = policy_bound + ppo.vf_coef * value_bound + ppo.entropy_coef * entropy + ppo.ptx_coef * ptx
    bounds["d_log_ratio"], bounds["d_value"] = d_log_ratio, value  # for the gradients' bounds
    return bounds


def assert_grads_close(
    got: dict[str, torch.Tensor],
    wanted: dict[str, torch.Tensor],
    moves: dict[str, torch.Tensor],
    config,
    positions: int,
    what: str,
) -> None:
    """Every gradient entry within :func:`gradient_bound` at the largest gradient entry of the model
    (the backward's own summation order) plus ``moves`` (its loss weights' bounds, :func:`weight_errors`)."""
    assert set(got) == set(wanted), (what, set(got) ^ set(wanted))
    scale = max(float(g.abs().max()) for g in wanted.values())
    assert scale > 0
    for name in got:
        bound = gradient_bound(config, scale, positions) + moves[name]
        difference = (got[name] - wanted[name]).abs()
        worst = int((difference - bound).argmax())
        assert (difference <= bound).all(), (
            f"{what} {name}: |difference| {float(difference.flatten()[worst]):.3g} over its bound "
            f"{float(bound.flatten()[worst]):.3g} at flat index {worst}"
        )

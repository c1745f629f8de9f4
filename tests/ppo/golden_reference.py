"""An independent PPO-RLHF reference for the golden-rollout test: plain loops over one response at a time.

Written from the formulas (Ziegler et al. 2019; Schulman et al. 2016 GAE; Schulman et al. 2017 PPO;
Ouyang et al. 2022 PPO-ptx), never calling ``rlhf_lit``: each row is run UNPADDED (its prompt
without left padding, its response up to and including the first EOS), so padding, masks and
position ids cannot matter here, and every quantity is a Python list per row.
"""

from __future__ import annotations

import math

import torch


def unpadded_rows(
    prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, responses: list[list[int]], stop_ids: set[int]
) -> list[tuple[list[int], list[int], bool]]:
    """``(prompt, response, ended)`` per row: the real prompt tokens and the response cut after its first stop id."""
    rows = []
    for ids, mask, response in zip(prompt_ids.tolist(), prompt_mask.tolist(), responses):
        prompt = [t for t, m in zip(ids, mask) if m]
        cut = next((i for i, t in enumerate(response) if t in stop_ids), None)
        rows.append((prompt, response if cut is None else response[: cut + 1], cut is not None))
    return rows


def response_logprobs_and_entropy(model, prompt: list[int], response: list[int], temperature: float):
    """Per response token: log pi(token | prefix) and the entropy of pi(. | prefix), pi = softmax(logits / T)."""
    seq = torch.tensor([prompt + response])
    logits = model(input_ids=seq).logits[0].float()  # (L, V)
    logprobs, entropies = [], []
    for t, token in enumerate(response):
        log_pi = torch.log_softmax(logits[len(prompt) - 1 + t] / temperature, dim=-1)  # the prefix ends at P - 1 + t
        logprobs.append(log_pi[token])
        entropies.append(-(log_pi.exp() * log_pi).sum())
    return logprobs, entropies


def token_values(value_model, prompt: list[int], response: list[int], offset: float):
    """V(state before response token t) = head(hidden at position P - 1 + t) + the unfolded reward offset."""
    seq = torch.tensor([prompt + response])
    hidden = value_model.model(input_ids=seq).last_hidden_state[0]  # (L, D)
    head = value_model.score
    return [head(hidden[len(prompt) - 1 + t]).squeeze() + offset for t in range(len(response))]


def reward_score(reward_model, prompt: list[int], response: list[int], offset: float) -> float:
    """The RM score: the head at the last token of query + response (its EOS when it has one), plus the offset."""
    seq = torch.tensor([prompt + response])
    hidden = reward_model.model(input_ids=seq).last_hidden_state[0]  # (L, D)
    return float(reward_model.score(hidden[-1]).squeeze()) + offset


def gae_row(rewards: list[float], values: list[float], gamma: float, lam: float) -> tuple[list[float], list[float]]:
    """GAE backwards over one response; the value after the last token is 0 (the episode ends)."""
    advantages = [0.0] * len(rewards)
    running = 0.0
    for t in reversed(range(len(rewards))):
        next_value = values[t + 1] if t + 1 < len(rewards) else 0.0
        delta = rewards[t] + gamma * next_value - values[t]
        running = delta + gamma * lam * running
        advantages[t] = running
    returns = [a + v for a, v in zip(advantages, values)]
    return advantages, returns


def whiten_all(rows: list[list[float]]) -> list[list[float]]:
    """Whiten every token of every row together: mean 0, unbiased variance 1 (eps 1e-8 inside the root)."""
    flat = [x for row in rows for x in row]
    mean = sum(flat) / len(flat)
    var = sum((x - mean) ** 2 for x in flat) / (len(flat) - 1)
    return [[(x - mean) / math.sqrt(var + 1e-8) for x in row] for row in rows]


def sft_row_loss_terms(model, input_ids: list[int], labels: list[int]):
    """Cross-entropy terms of one unpadded SFT row: token t + 1 predicted at t wherever its label counts."""
    logits = model(input_ids=torch.tensor([input_ids])).logits[0].float()  # (L, V)
    return [
        -torch.log_softmax(logits[t], dim=-1)[labels[t + 1]] for t in range(len(input_ids) - 1) if labels[t + 1] != -100
    ]


def minibatch_losses(policy, critic, row, ptx_batch, expected, ppo, temperature: float, reward_offset: float):
    """Losses of a one-row minibatch from the formulas (with their graph), and per token what their bounds need
    (:func:`golden_bounds.loss_bounds`); ``ppo`` has the clip ranges and the loss coefficients."""
    prompt, response, _ = expected["rows"][row]
    logprobs, entropies = response_logprobs_and_entropy(policy, prompt, response, temperature)
    values = token_values(critic, prompt, response, reward_offset)
    eps, eps_v = ppo.clip_range, ppo.value_clip_range
    pg, vl, tokens = [], [], []
    for t in range(len(response)):
        a, old = expected["adv"][row][t], expected["logprobs"][row][t]
        ratio = torch.exp(logprobs[t] - old)
        pg.append(torch.maximum(-a * ratio, -a * ratio.clamp(1 - eps, 1 + eps)))
        old_v, ret = expected["values"][row][t], expected["returns"][row][t]
        v_clipped = old_v + (values[t] - old_v).clamp(-eps_v, eps_v)
        vl.append(0.5 * torch.maximum((values[t] - ret) ** 2, (v_clipped - ret) ** 2))
        tokens.append(
            {
                "advantage": a,
                "ratio": float(ratio.detach()),
                "value": float(values[t].detach()),
                "value_clipped": float(v_clipped.detach()),
                "return": ret,
                "logprob_out": logprobs[t],
                "value_out": values[t],
            }
        )
    policy_loss, value_loss = torch.stack(pg).mean(), torch.stack(vl).mean()
    entropy = torch.stack(entropies).mean()
    ptx_terms = []
    for ids, mask, labels in zip(ptx_batch["input_ids"], ptx_batch["attention_mask"], ptx_batch["labels"]):
        n = int(mask.sum())  # right padded: the real tokens come first
        ptx_terms += sft_row_loss_terms(policy, ids[:n].tolist(), labels[:n].tolist())
    ptx = torch.stack(ptx_terms).mean()
    total = policy_loss + ppo.vf_coef * value_loss - ppo.entropy_coef * entropy + ppo.ptx_coef * ptx
    parts = {"loss/policy": policy_loss, "loss/value": value_loss, "policy/entropy": entropy, "loss/ptx": ptx}
    return total, parts, (tokens, float(torch.stack(entropies).detach().max()))

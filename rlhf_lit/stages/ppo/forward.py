"""The policy and critic forward pass that rollout scoring and the update share."""

from __future__ import annotations

import torch

from rlhf_lit.models.generation import forward_response_logits


def policy_and_values(
    policy: torch.nn.Module,
    critic: torch.nn.Module | None,
    query_responses: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_length: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Response logits ``(B, R, V)`` and values ``(B, R)`` (None without a critic); value t is read
    where token t is predicted (position ``P - 1 + t``).

    A shared-trunk critic reads the policy's last hidden states from the same forward pass.
    """
    needs_hidden = critic is not None and critic.needs_policy_hidden
    logits, out = forward_response_logits(
        policy, query_responses, attention_mask, prompt_length, output_hidden_states=needs_hidden
    )  # (B, R, V)
    if critic is None:
        return logits, None
    hidden = out.hidden_states[-1] if needs_hidden else None  # (B, T, D)
    values = critic(query_responses, attention_mask, hidden)  # (B, T)
    return logits, values[:, prompt_length - 1 : -1]  # (B, R, V), (B, R)

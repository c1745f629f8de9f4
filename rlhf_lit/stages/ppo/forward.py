"""The policy and critic forward pass that rollout scoring and the update share, run eagerly or
compiled (``ppo.forward``, :class:`ForwardPassRunner`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlhf_lit.functional import attended_span, length_groups
from rlhf_lit.models.compiled_generation import CompileStats
from rlhf_lit.models.compiled_passes import BucketedCompile, ForwardPasses
from rlhf_lit.models.sharding import is_sharded
from rlhf_lit.models.teacher_forced import forward_response_logits


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


def grouped_policy_and_values(
    policy: torch.nn.Module,
    critic: torch.nn.Module | None,
    query_responses: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_length: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`policy_and_values` over the rows in length groups (:func:`~rlhf_lit.functional.length_groups`),
    each without the left padding none of its rows attends: one long prompt no longer pads every
    other row to its length. The same outputs up to the order of float sums (positions come from
    the mask), in the rows' order."""
    groups = length_groups(attention_mask)
    if len(groups) == 1:
        return policy_and_values(policy, critic, query_responses, attention_mask, prompt_length)
    device = query_responses.device
    parts = []
    for rows in groups:
        rows = rows.to(device)
        ids, mask = query_responses[rows], attention_mask[rows]  # (M, T) x2
        first, _ = attended_span(mask, prompt_length)
        parts.append(policy_and_values(policy, critic, ids[:, first:], mask[:, first:], prompt_length - first))
    back = torch.argsort(torch.cat(groups)).to(device)  # (B,): row i's place in the groups' concatenation
    logits = torch.cat([p[0] for p in parts])[back]  # (B, R, V)
    values = None if critic is None else torch.cat([p[1] for p in parts])[back]  # (B, R)
    return logits, values


def critic_values(
    critic: torch.nn.Module, query_responses: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int
) -> tuple[torch.Tensor]:
    """A separate critic's values ``(B, R)`` alone (when the old logprobs come from sampling), as a
    one-tuple like :func:`policy_and_values`'s outputs."""
    return (critic(query_responses, attention_mask, None)[:, prompt_length - 1 : -1],)  # (B, R)


@dataclass
class ForwardPassRunner:
    """The policy-and-critic pass and the critic-only pass as ``ppo.forward`` runs them.

    Attributes:
        kind: ``eager`` or ``compiled`` (:data:`~rlhf_lit.models.compiled_passes.ForwardPasses`).
        stats: the graphs compiled and the seconds of the calls that compiled (zeros when eager).
    """

    kind: ForwardPasses = "eager"
    stats: CompileStats = field(default_factory=CompileStats)

    def __post_init__(self) -> None:
        if self.kind == "compiled":
            self._both = BucketedCompile(policy_and_values, self.stats)
            self._critic = BucketedCompile(critic_values, self.stats)

    def policy_and_values(
        self,
        policy: torch.nn.Module,
        critic: torch.nn.Module | None,
        query_responses: torch.Tensor,
        attention_mask: torch.Tensor,
        prompt_length: int,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:func:`policy_and_values`, eager or compiled."""
        if self.kind == "compiled":
            return self._both(
                policy, critic, ids=query_responses, attention_mask=attention_mask, prompt_length=prompt_length
            )
        # Sharded (FSDP) models gather their weights per forward: one pass, not one per group.
        run = policy_and_values if is_sharded(policy) else grouped_policy_and_values
        return run(policy, critic, query_responses, attention_mask, prompt_length)

    def critic_values(
        self, critic: torch.nn.Module, query_responses: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int
    ) -> torch.Tensor:
        """:func:`critic_values`, eager or compiled: ``(B, R)``."""
        if self.kind == "eager":
            return critic_values(critic, query_responses, attention_mask, prompt_length)[0]
        return self._critic(critic, ids=query_responses, attention_mask=attention_mask, prompt_length=prompt_length)[0]

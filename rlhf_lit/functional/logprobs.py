"""Per-token log-probabilities and entropies from language-model logits."""

from __future__ import annotations

import torch


def _scaled_float_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Upcast half precision logits to float32 (log-softmax in bf16 loses ~2 digits) and divide by T."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}.")
    # promote_types keeps float64 (gradcheck) and lifts bf16 / fp16 to float32.
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # (B, T, V)
    if temperature != 1.0:
        logits = logits / temperature  # (B, T, V)
    return logits


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probability of each label under ``softmax(logits / temperature)``.

    The caller aligns positions (for a causal LM: ``logits[:, :-1]`` with ``input_ids[:, 1:]``).
    Use the sampling temperature so the logprobs belong to the distribution that generated the tokens.

    Args:
        logits: ``(B, T, V)``, any float dtype; computed in at least float32.
        labels: ``(B, T)`` long token ids, all valid indices into ``V`` (replace ignore ids such as
            -100 before calling; mask the result instead).
        temperature: > 0.

    Returns:
        ``(B, T)`` log-probabilities, float32 (float64 for float64 logits).
    """
    logits = _scaled_float_logits(logits, temperature)  # (B, T, V)
    # gather - logsumexp avoids materialising a second (B, T, V) log_softmax tensor.
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (B, T)
    return picked - torch.logsumexp(logits, dim=-1)  # (B, T)


def log_distributions(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Every token's log-probability under ``softmax(logits / temperature)`` at every position.

    Args:
        logits: ``(B, T, V)``; computed in at least float32.
        temperature: > 0.

    Returns:
        ``(B, T, V)`` log-probabilities, float32 (float64 for float64 logits).
    """
    return torch.log_softmax(_scaled_float_logits(logits, temperature), dim=-1)  # (B, T, V)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy ``-sum_v p_v log p_v`` of ``softmax(logits / temperature)`` at every position.

    Args:
        logits: ``(B, T, V)``; computed in at least float32.
        temperature: > 0.

    Returns:
        ``(B, T)`` entropies in nats (uniform over V gives ``log V``).
    """
    return entropy_of(log_distributions(logits, temperature))  # (B, T)


def entropy_of(log_probs: torch.Tensor) -> torch.Tensor:
    """Entropy ``-sum_v p_v log p_v`` of normalised ``(B, T, V)`` log-probabilities: ``(B, T)`` nats."""
    return -(log_probs.exp() * log_probs).sum(dim=-1)  # (B, T)


def sequence_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, response_mask: torch.Tensor, average: bool = False
) -> torch.Tensor:
    """Log-probability of each row's response under a causal LM: sum (or mean) over response tokens.

    Position ``t`` of ``logits`` predicts token ``t + 1`` of ``input_ids``, so the token at ``t``
    is scored by ``logits[:, t - 1]``; a token at position 0 has no prediction and never counts.
    Prompt and pad positions are left out by ``response_mask`` alone (left or right padding; the
    values of the logits there never matter).

    Args:
        logits: ``(B, T, V)`` causal-LM logits of ``input_ids``; computed in at least float32.
        input_ids: ``(B, T)`` token ids.
        response_mask: bool ``(B, T)`` aligned with ``input_ids``: True on the response tokens.
        average: divide by the number of response tokens (the mean logprob per token) instead of
            summing. A row without response tokens gives 0 (sum) or NaN (mean).

    Returns:
        ``(B,)`` float32 (float64 for float64 logits).
    """
    logprobs = token_logprobs(logits[:, :-1], input_ids[:, 1:])  # (B, T-1) logprob of token t+1
    mask = response_mask[:, 1:].bool()  # (B, T-1) aligned with the predicted tokens
    total = torch.where(mask, logprobs, torch.zeros_like(logprobs)).sum(dim=-1)  # (B,)
    if not average:
        return total
    return total / mask.sum(dim=-1).to(total.dtype)  # (B,)

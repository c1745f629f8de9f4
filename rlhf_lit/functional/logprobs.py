"""Per-token log-probabilities and entropies from language-model logits."""

from __future__ import annotations

import torch

__all__ = ["token_logprobs", "entropy_from_logits"]


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


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy ``-sum_v p_v log p_v`` of ``softmax(logits / temperature)`` at every position.

    Args:
        logits: ``(B, T, V)``; computed in at least float32.
        temperature: > 0.

    Returns:
        ``(B, T)`` entropies in nats (uniform over V gives ``log V``).
    """
    logits = _scaled_float_logits(logits, temperature)  # (B, T, V)
    logp = torch.log_softmax(logits, dim=-1)  # (B, T, V)
    return -(logp.exp() * logp).sum(dim=-1)  # (B, T)

"""Seeded, batched sampling from a causal LM, decoding, and logprobs of the sampled responses."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rlhf_lit.functional import response_mask_from_eos, token_logprobs
from rlhf_lit.models import load_causal_lm, position_ids_from_mask
from rlhf_lit.tokenizer import load_tokenizer


@dataclass(frozen=True)
class SamplingConfig:
    """How completions are sampled (the same settings for preferences and evaluation).

    Sampling is plain ancestral sampling from ``softmax(logits / temperature)``: no top-k and no
    top-p, so logprobs computed with the same temperature belong to the sampling distribution.
    """

    temperature: float = 1.0
    """Sampling temperature (> 0); also divides the logits when KL is measured."""
    max_new_tokens: int = 48
    """Most tokens generated per completion (EOS included)."""
    batch_size: int = 64
    """Completions generated per ``generate`` call (changing it changes the samples of a seed)."""
    seed: int = 0
    """Seed of the sampling; the global RNG state is restored afterwards."""

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.max_new_tokens < 1 or self.batch_size < 1:
            raise ValueError("max_new_tokens and batch_size must be >= 1")


@dataclass
class Generation:
    """One generated batch. Prompts are left padded; responses end at the first EOS."""

    prompt_ids: torch.Tensor  # (B, P) long, left padded
    prompt_mask: torch.Tensor  # (B, P) long attention mask of the prompt
    response_ids: torch.Tensor  # (B, R) long, pad after the first EOS
    response_mask: torch.Tensor  # (B, R) bool, True up to and including the first EOS
    ended: torch.Tensor  # (B,) bool, True where the response contains an EOS


def load_model(
    path: str, tokenizer_path: str | None = None, device: str = "cpu"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A causal LM in eval mode and its tokenizer (left padding, for generation).

    Args:
        path: model directory or hub name.
        tokenizer_path: where the tokenizer is, when not saved beside the model.
        device: torch device to run on.
    """
    tokenizer = load_tokenizer(tokenizer_path or path, padding_side="left")
    model = load_causal_lm(path, tokenizer).to(device).eval()
    return model, tokenizer


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    config: SamplingConfig,
) -> list[Generation]:
    """Sample one completion per entry of ``prompts`` (repeat a prompt to get K), in batches.

    Seeded with ``config.seed`` inside ``torch.random.fork_rng``, so the same call gives the
    same completions and the caller's RNG state is untouched.
    """
    device = model.device
    batches = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(config.seed)
        for start in range(0, len(prompts), config.batch_size):
            chunk = list(prompts[start : start + config.batch_size])
            enc = tokenizer(chunk, return_tensors="pt", padding=True).to(device)
            sequences = model.generate(
                input_ids=enc["input_ids"],
                attention_mask=enc["attention_mask"],
                do_sample=True,
                temperature=config.temperature,
                top_k=0,  # 0 and 1.0 switch the filters off (a checkpoint may set defaults)
                top_p=1.0,
                max_new_tokens=config.max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )  # (B, P + R)
            response_ids = sequences[:, enc["input_ids"].shape[1] :]  # (B, R)
            response_mask, ended = response_mask_from_eos(response_ids, tokenizer.eos_token_id)
            batches.append(
                Generation(
                    enc["input_ids"], enc["attention_mask"], response_ids, response_mask, ended
                )
            )
    return batches


def decode(tokenizer: PreTrainedTokenizerBase, batch: Generation) -> tuple[list[str], list[str]]:
    """``(prompt texts, response texts)`` of a batch; the response text has no EOS.

    The response is cut from the decoded prompt + response, so ``prompt + response`` is exactly
    the text the model produced (decoding the response alone can lose a leading space with
    sentencepiece tokenizers). Falls back to decoding the response alone if the decoded prompt is
    not a prefix of the decoded whole.
    """
    content = batch.response_mask.sum(-1) - batch.ended.long()  # (B,) response tokens before EOS
    prompts, responses = [], []
    for row, n in enumerate(content.tolist()):
        prompt_ids = batch.prompt_ids[row][batch.prompt_mask[row].bool()].tolist()
        response_ids = batch.response_ids[row, :n].tolist()
        prompt = tokenizer.decode(prompt_ids, skip_special_tokens=True)
        whole = tokenizer.decode(prompt_ids + response_ids, skip_special_tokens=True)
        if whole.startswith(prompt):
            response = whole[len(prompt) :]
        else:
            response = tokenizer.decode(response_ids, skip_special_tokens=True)
        prompts.append(prompt)
        responses.append(response)
    return prompts, responses


@torch.no_grad()
def response_logprobs(
    model: PreTrainedModel, batch: Generation, temperature: float
) -> torch.Tensor:
    """Logprob of each sampled response token under ``softmax(model logits / temperature)``.

    One forward pass over prompt + response with ``position_ids = cumsum(mask) - 1`` so left
    padded rows see the positions ``generate`` gave them. Positions after the first EOS are
    garbage; mask them with ``batch.response_mask``.

    Returns:
        ``(B, R)`` float32.
    """
    input_ids = torch.cat([batch.prompt_ids, batch.response_ids], dim=1)  # (B, P + R)
    attention_mask = torch.cat(
        [batch.prompt_mask.long(), batch.response_mask.long()], dim=1
    )  # (B, P + R)
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    ).logits  # (B, P + R, V)
    P = batch.prompt_ids.shape[1]
    # The logit at position t predicts token t + 1: response token r is predicted at P - 1 + r.
    return token_logprobs(logits[:, P - 1 : -1], batch.response_ids, temperature)  # (B, R)

"""Sampling responses from a policy (the teacher-forced pass that scores them: :mod:`rlhf_lit.models.teacher_forced`).

Generation uses Hugging Face ``generate`` (KV cache, left-padded prompts, per-row stop at EOS).
``generate`` draws from the global torch RNG and takes no generator, so :func:`generate_responses`
draws one seed from the caller's ``torch.Generator`` and samples inside ``torch.random.fork_rng``
seeded with it: the caller's stream decides the samples and the global RNG is left untouched.

``generate`` fills every setting a passed ``GenerationConfig`` leaves unset from the model's own
``generation_config`` (a checkpoint's ``generation_config.json``: ``repetition_penalty``, ``min_p``,
``no_repeat_ngram_size``, ...). Such settings would reshape the distribution the tokens are drawn
from while logprobs are computed from ``softmax(logits / temperature)``, so
:func:`generate_responses` hides the model's defaults while it samples: only :class:`SamplingConfig`
decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, fields
from typing import Literal

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, PreTrainedTokenizerBase

from rlhf_lit.functional import attended_span, pad_ids, response_mask_from_eos
from rlhf_lit.models.compiled_generation import compiled_generate_settings, counting_compiles, static_cache
from rlhf_lit.models.precision import SamplingPrecision, sampling_precision
from rlhf_lit.models.step_logprobs import StepLogprobs
from rlhf_lit.models.token_draw import DRAWS, Draw, draw_processors
from rlhf_lit.option_values import check_finite, check_least

Decode = Literal["eager", "compiled"]
"""How ``generate`` runs each decode step (``SamplingConfig.decode``)."""


@dataclass(frozen=True)
class SamplingConfig:
    """How responses are sampled.

    Logprobs are always computed from ``softmax(logits / temperature)`` (N details #7), over the
    whole vocabulary: top-k / top-p shape what is sampled but not the logprobs (as in TRL and
    OpenRLHF), so the PPO ratio is exactly 1 before the first update either way.

    Args:
        max_new_tokens: the most tokens generated per response.
        temperature: divides the logits when sampling and whenever logprobs are computed.
        top_k: sample among the k most likely tokens; 0 = off.
        top_p: nucleus sampling threshold; 1.0 = off.
        do_sample: sample (True) or decode greedily (False; then temperature must be 1).
        samples_per_prompt: k, the responses sampled per prompt. With k > 1 each prompt row is
            repeated k times as consecutive rows before generation (rows ``[g*k:(g+1)*k]`` are
            prompt g's group), so a rollout has ``batch_size * k`` rows; the data module's
            ``batch_size`` stays the number of prompts. The group estimators (``ppo.estimator``
            grpo, dr_grpo, rloo) need k >= 2.
        ignore_eos: sample exactly ``max_new_tokens`` tokens per response, whatever is sampled
            (vLLM's ``ignore_eos``): a stop id is then an ordinary token, every position is part
            of the response and no response counts as ended. For benchmarks with a fixed amount
            of work per rollout; the logits are not changed (unlike ``min_new_tokens``, which
            masks EOS and so samples from another distribution than the logprobs score).
        decode: ``eager`` runs ``generate`` as Hugging Face ships it (a growing KV cache, each
            step op by op); ``compiled`` decodes with a static KV cache and a ``torch.compile``d
            step (:mod:`rlhf_lit.models.compiled_generation`; CUDA graphs on GPU): the same tokens
            under greedy decoding and the same logprobs within float32 rounding, after a one-off
            compile per batch size, cache-length bucket and precision (tens of seconds on CPU).
            Under bf16 autocast (``trainer.precision`` / ``precision: bf16-mixed``) it samples too,
            its logprobs float32 as ever, but bf16 rounds its steps otherwise than the eager ones,
            so a seed's samples can differ from the eager path's.
        draw: how each token is drawn from the step's distribution (:mod:`rlhf_lit.models.token_draw`):
            ``multinomial`` as ``generate`` ships, or ``inverse_cdf`` (one uniform per row: the same
            distribution, other samples of a seed, and 28x cheaper a step on a CPU at a 49k vocabulary).
    """

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    do_sample: bool = True
    samples_per_prompt: int = 1
    ignore_eos: bool = False
    decode: Decode = "eager"
    draw: Draw = "multinomial"

    def __post_init__(self) -> None:
        check_least("sampling.samples_per_prompt", self.samples_per_prompt, 1)
        check_least("sampling.max_new_tokens", self.max_new_tokens, 1)
        check_least("sampling.temperature", self.temperature, 0, strict=True)
        check_finite("sampling.temperature", self.temperature)  # logits / inf: a uniform draw, scored so
        if self.top_k < 0 or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"sampling.top_k must be >= 0 and top_p in (0, 1]; got {self.top_k}, {self.top_p}")
        if not self.do_sample and (self.temperature != 1.0 or self.top_k or self.top_p != 1.0):
            raise ValueError("sampling.do_sample=False decodes greedily: leave temperature=1, top_k=0, top_p=1")
        if self.decode not in ("eager", "compiled"):
            raise ValueError(f"sampling.decode must be 'eager' or 'compiled', got {self.decode!r}")
        if self.draw not in DRAWS:
            raise ValueError(f"sampling.draw must be one of {', '.join(DRAWS)}; got {self.draw!r}")


@dataclass(frozen=True)
class DecodeSettings:
    """What ``sampling.decode`` adds to one ``generate`` call (:func:`decode_settings`).

    Attributes:
        config: ``GenerationConfig`` fields.
        inputs: keyword arguments of ``generate`` itself (the cache it fills, ``past_key_values``).
    """

    config: dict
    inputs: dict


def decode_settings(sampling: SamplingConfig, model: PreTrainedModel, prompt_length: int) -> DecodeSettings:
    """What ``sampling.decode`` adds to a ``generate`` call of ``model`` on prompts of ``prompt_length``
    columns: nothing for ``eager`` (a dynamic cache, transformers' default); for ``compiled`` the
    ``CompileConfig`` (:func:`~rlhf_lit.models.compiled_generation.compiled_generate_settings`) and a
    new static cache (:func:`~rlhf_lit.models.compiled_generation.static_cache`)."""
    if sampling.decode == "compiled":
        return DecodeSettings(
            compiled_generate_settings(model),
            {"past_key_values": static_cache(model, prompt_length, sampling.max_new_tokens)},
        )
    return DecodeSettings({}, {})


def stop_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    """Every id that ends a response: the tokenizer's EOS, then the model's ``generation_config`` ones.

    Chat models list several (Llama 3: ``<|eot_id|>`` and ``<|end_of_text|>`` in
    ``generation_config.eos_token_id``) while ``tokenizer.eos_token_id`` names one. Generation,
    response masks, the reward position and the missing-EOS penalty must all use the same full
    set, so it is computed here, once, and passed to each of them.
    """
    ids: list[int] = []
    config = getattr(model, "generation_config", None)
    model_eos = None if config is None else config.eos_token_id
    for eos in [tokenizer.eos_token_id, *(model_eos if isinstance(model_eos, (list, tuple)) else [model_eos])]:
        if eos is not None and int(eos) not in ids:
            ids.append(int(eos))
    if not ids:
        raise ValueError("neither the tokenizer nor the model's generation_config names an EOS token")
    return tuple(ids)


@dataclass
class Generated:
    """Prompts with their sampled responses.

    Attributes:
        query_responses: ``(B, P + R)`` long, prompt (left padded) then response; pad after EOS.
        attention_mask: ``(B, P + R)`` long, the prompt mask then the response mask.
        response_ids: ``(B, R)`` long, the response part (pad after the first EOS).
        response_mask: ``(B, R)`` bool, True up to and including the first EOS.
        ended: ``(B,)`` bool, the response contains EOS.
        logprobs: ``(B, R)`` float32, the logprob of each response token under ``softmax(logits /
            temperature)`` of the logits it was sampled from (before top-k / top-p), recorded while
            sampling (:class:`~rlhf_lit.models.step_logprobs.StepLogprobs`), when
            :func:`generate_responses` was asked for them; else None. Pad positions hold the pad's logprob.
        entropy: ``(B, R)`` float32, the entropy of that distribution at each step, with ``logprobs``.
    """

    query_responses: torch.Tensor
    attention_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    ended: torch.Tensor
    logprobs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None

    @property
    def prompt_length(self) -> int:
        """P, the padded prompt length."""
        return self.query_responses.shape[1] - self.response_ids.shape[1]

    def rows(self, start: int | torch.Tensor, stop: int | None = None) -> Generated:
        """Rows ``start:stop`` of every field, or the rows a ``(M,)`` index tensor ``start`` names."""
        index = start if stop is None else slice(start, stop)
        return Generated(*(None if t is None else t[index] for t in (getattr(self, f.name) for f in fields(self))))

    def trimmed(self) -> Generated:
        """These rows without the columns none of them attends (:func:`~rlhf_lit.functional.attended_span`):
        the left padding in front of the longest prompt and the padding after the longest response.

        Every pass over the trimmed rows gives the kept positions' outputs of the full rows (up to
        the order of float sums) for less work; its per-token fields have ``R'`` <= R columns, the
        first ``R'`` response positions.
        """
        first, stop = attended_span(self.attention_mask, self.prompt_length)
        kept = stop - self.prompt_length  # R'
        return Generated(
            self.query_responses[:, first:stop],
            self.attention_mask[:, first:stop],
            self.response_ids[:, :kept],
            self.response_mask[:, :kept],
            self.ended,
            *(None if t is None else t[:, :kept] for t in (self.logprobs, self.entropy)),
        )


def complete_generation(
    sequences: torch.Tensor, prompt_mask: torch.Tensor, eos_token_id: int | Sequence[int], pad_token_id: int
) -> Generated:
    """Masks for raw ``generate`` output: everything after the first EOS is masked and set to pad.

    Args:
        sequences: ``(B, P + R)`` prompt then generated ids, whatever follows an EOS.
        prompt_mask: ``(B, P)`` attention mask of the (left-padded) prompt.
        eos_token_id: ends a response (the EOS itself belongs to it); one id or several
            (:func:`stop_token_ids`); an empty sequence when nothing ends a response
            (``SamplingConfig.ignore_eos``): all of it is the response and no row has ended.
        pad_token_id: written after the EOS (never used to derive a mask).
    """
    prompt_length = prompt_mask.shape[1]
    response_ids = sequences[:, prompt_length:]  # (B, R)
    if isinstance(eos_token_id, Sequence) and len(eos_token_id) == 0:  # ignore_eos: every token is the response's
        response_mask = torch.ones_like(response_ids, dtype=torch.bool)  # (B, R)
        ended = torch.zeros(response_ids.shape[0], dtype=torch.bool, device=response_ids.device)  # (B,)
    else:
        response_mask, ended = response_mask_from_eos(response_ids, eos_token_id)  # (B, R), (B,)
    response_ids = torch.where(response_mask, response_ids, torch.full_like(response_ids, pad_token_id))  # (B, R)
    query_responses = torch.cat([sequences[:, :prompt_length], response_ids], dim=1)  # (B, P + R)
    attention_mask = torch.cat([prompt_mask.long(), response_mask.long()], dim=1)  # (B, P + R)
    return Generated(query_responses, attention_mask, response_ids, response_mask, ended)


@torch.no_grad()
def generate_responses(
    policy: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    sampling: SamplingConfig,
    eos_token_id: int | Sequence[int],
    pad_token_id: int,
    generator: torch.Generator | None = None,
    synced_gpus: bool = False,
    return_logprobs: bool = False,
) -> Generated:
    """Sample one response per left-padded prompt with the KV cache, stopping each row at EOS.

    Call it on the unwrapped model (``self.policy``), never a DDP wrapper (which has no ``generate``).

    Args:
        policy: a Hugging Face causal LM.
        input_ids: ``(B, P)`` left-padded prompts.
        attention_mask: ``(B, P)`` 1 on prompt tokens.
        sampling: the sampling settings.
        eos_token_id: ends a response: one id or several (pass :func:`stop_token_ids`, since the
            model's own ``generation_config`` is hidden while sampling).
        pad_token_id: fills the positions after EOS.
        generator: source of the sampling seed (see the module docstring); None samples from the
            global RNG as ``generate`` does.
        synced_gpus: keep all ranks stepping until every rank is done (needed under FSDP, where
            each forward pass is a collective).
        return_logprobs: record each sampled token's logprob and each step's entropy in
            ``Generated.logprobs`` / ``Generated.entropy`` (:class:`StepLogprobs`: ``(B, R)`` each,
            never the ``(B, R, V)`` logits).
    """
    # ignore_eos: no stop id at all, so every row runs to max_new_tokens with untouched logits.
    stops = None if sampling.ignore_eos else eos_token_id if isinstance(eos_token_id, int) else list(eos_token_id)
    decode = decode_settings(sampling, policy, input_ids.shape[1])
    # inverse_cdf: generate decodes greedily through processors that warp the logits and draw the token.
    do_sample, drawing = (
        draw_processors(sampling.draw, sampling.temperature, sampling.top_k, sampling.top_p)
        if sampling.do_sample
        else (False, [])
    )
    config = GenerationConfig(
        max_new_tokens=sampling.max_new_tokens,
        do_sample=do_sample,
        temperature=sampling.temperature if do_sample else None,
        top_k=sampling.top_k if do_sample else None,
        top_p=sampling.top_p if do_sample else None,
        eos_token_id=stops,
        pad_token_id=pad_token_id,
        use_cache=True,
        **decode.config,
    )
    recorder = StepLogprobs(sampling.temperature) if return_logprobs else None
    # The recorder first: it reads the raw logits, before any warper or the draw.
    processors = LogitsProcessorList([*([] if recorder is None else [recorder]), *drawing])
    device = input_ids.device
    # generate would fill what `config` leaves unset from the model's generation_config (see the
    # module docstring): hide it, so the samples follow softmax(logits / temperature) as the logprobs do.
    model_defaults = policy.generation_config
    policy.generation_config = GenerationConfig()
    # the compiled path counts the graphs its calls compile (compiled_generation.compile_stats)
    counting = counting_compiles() if sampling.decode == "compiled" else nullcontext()
    # fork_rng restores the global CPU (and this CUDA device's) RNG afterwards.
    seeded = (
        nullcontext()
        if generator is None
        else torch.random.fork_rng(devices=[device] if device.type == "cuda" else [], device_type=device.type)
    )
    try:
        with counting, seeded:
            if generator is not None:
                torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))
            sequences = policy.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=config,
                synced_gpus=synced_gpus,
                logits_processor=processors,
                **decode.inputs,
            )  # (B, P + R)
    finally:
        policy.generation_config = model_defaults
    generated = complete_generation(
        sequences, attention_mask, () if sampling.ignore_eos else eos_token_id, pad_token_id
    )
    if recorder is not None:  # the tokens as drawn (generate writes pad after EOS itself)
        generated.logprobs, generated.entropy = recorder.finish(sequences[:, input_ids.shape[1] :])  # (B, R) x2
    return generated


def sample_batches(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str] | Sequence[Sequence[int]],
    sampling: SamplingConfig,
    *,
    batch_size: int,
    seed: int,
    precision: SamplingPrecision = "32-true",
) -> list[Generated]:
    """One response per entry of ``prompts`` (repeat a prompt to get K), ``batch_size`` rows a batch.

    Every batch samples through :func:`generate_responses` from one ``torch.Generator`` seeded
    with ``seed`` (each batch draws its own sampling seed from it), so a call is reproducible,
    the global RNG is untouched, and changing ``batch_size`` changes the samples of a seed.

    Args:
        model: causal LM in eval mode.
        tokenizer: its tokenizer, padding on the left (``load_tokenizer(..., padding_side="left")``).
        prompts: prompt texts (tokenized with the tokenizer's specials), or prompt token ids as they
            are (rendered by :mod:`rlhf_lit.data.prompt_rendering`); row ``i`` of the concatenated
            batches answers ``prompts[i]``.
        sampling: the library's sampling settings.
        batch_size: prompts per ``generate`` call (>= 1).
        seed: seed of the generator.
        precision: ``32-true`` samples in the weights' float32; ``bf16-mixed`` under bf16 autocast
            (:func:`~rlhf_lit.models.precision.sampling_precision`): other samples of a seed, faster on a
            CPU with bf16 instructions (AMX, AVX512_BF16) or a GPU, slower on a CPU without. Only ``generate`` runs under it.
    """
    check_least("batch_size", batch_size, 1)
    if tokenizer.padding_side != "left":
        raise ValueError("sample_batches needs a left-padding tokenizer: generate continues the last column")
    generator = torch.Generator().manual_seed(seed)
    stop_ids = stop_token_ids(model, tokenizer)
    batches = []
    for start in range(0, len(prompts), batch_size):
        chunk = list(prompts[start : start + batch_size])
        if chunk and isinstance(chunk[0], str):
            encoded = tokenizer(chunk, return_tensors="pt", padding=True)
            ids, mask = encoded["input_ids"], encoded["attention_mask"]
        else:
            ids, mask = pad_ids(chunk, tokenizer.pad_token_id, "left")  # generate continues the last column
        with sampling_precision(precision, model.device):
            generated = generate_responses(
                model,
                ids.to(model.device),
                mask.to(model.device),
                sampling,
                eos_token_id=stop_ids,
                pad_token_id=tokenizer.pad_token_id,
                generator=generator,
            )
        batches.append(generated)
    return batches

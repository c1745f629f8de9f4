"""Loading the models of an evaluation and sampling measured responses from the policy.

What ``rlhf-lit evaluate`` and ``rlhf-lit best-of-n`` share. Sampling is the library's
(:func:`rlhf_lit.models.generation.sample_batches`: one seeded generator, left-padded batches),
KL is the per-response sum over response tokens (EOS included) of ``logprob_policy -
logprob_ref`` at the sampling temperature (:func:`rlhf_lit.models.teacher_forced.response_logprobs`),
the reward is the reward model's score at the last response token plus its stored normalisation
offset (as the PPO stage reads it), and responses are decoded as every judge reads them
(:func:`rlhf_lit.evaluation.response_texts`).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # annotations only: importing this module loads no model code
    from rlhf_lit.data.conversation import TextOrConversation
    from rlhf_lit.data.prompt_rendering import RenderedPrompts
    from rlhf_lit.data.prompt_source import Prompts, PromptSet
    from rlhf_lit.data.rendering import TemplateOption
    from rlhf_lit.models.generation import SamplingConfig
    from rlhf_lit.models.precision import SamplingPrecision
    from rlhf_lit.models.scoring import UnfinishedScoring

log = logging.getLogger(__name__)


def check_positive(**values: int | None) -> None:
    """Raise ``ValueError`` for an argument (given as ``name=value``) below 1.

    The message names it as the commands' option (``--batch-size must be >= 1, got 0``): the
    commands check their options with this same rule (as an option error) before calling here.
    """
    for name, value in values.items():
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")


def mean_std(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and population standard deviation (divided by ``len(xs)``, not ``len(xs) - 1``)."""
    mean = sum(xs) / len(xs)
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))


def same_folder(a: str, b: str) -> bool:
    """Whether two model locations name one model: the same string, or one local folder by two paths."""
    return a == b or (os.path.isdir(a) and os.path.isdir(b) and os.path.samefile(a, b))


def check_same_tokenizer(tokenizer, reference: str) -> None:
    """Raise if the reference ships a tokenizer with another vocabulary than the policy's.

    KL compares logprobs of the same token ids, so both models must share one vocabulary. A
    reference directory without tokenizer files is taken to use the policy's tokenizer.
    """
    from rlhf_lit.sources import DamagedSource, unloadable_tokenizer
    from rlhf_lit.tokenizer import load_tokenizer

    try:
        ref_tok = load_tokenizer(reference)
    except DamagedSource:
        raise  # damaged tokenizer files are not "no tokenizer": never assumed to be the policy's
    except (OSError, ValueError, TypeError) as error:
        damaged = unloadable_tokenizer(reference, "--reference", error)  # files there that do not load
        if damaged is not None:
            raise damaged from None
        log.info("no tokenizer in %s: assuming it uses the policy's", reference)
        return
    if ref_tok.get_vocab() != tokenizer.get_vocab():
        raise ValueError(
            f"the reference {reference!r} has another tokenizer vocabulary than the policy "
            f"({len(ref_tok)} vs {len(tokenizer)} tokens); KL needs one vocabulary"
        )


class NotARewardModel(ValueError):
    """A model given as a reward model that has no trained score head (:func:`check_reward_model`)."""


def check_reward_model(path: str, option: str = "--reward-model") -> None:
    """Refuse a reward model (the ``option`` that gave it) saved as another kind of model (a causal LM has no
    trained score head): ``rlhf-lit evaluate`` and ``best-of-n``, ``iterate``'s settings and PPO's ``fit``.

    Loading one as a reward model would give it a fresh random head: scores that mean nothing.
    A reward-model ensemble (:mod:`rlhf_lit.models.reward_ensemble`) is read through its manifest.
    """
    from transformers import AutoConfig

    from rlhf_lit.models.reward_ensemble import is_reward_ensemble, read_manifest
    from rlhf_lit.sources import from_pretrained

    if is_reward_ensemble(path):
        read_manifest(path)  # a broken manifest is refused here, naming the file
        return

    config = from_pretrained(AutoConfig.from_pretrained, path, option)  # a config it cannot read: one line
    architectures = getattr(config, "architectures", None) or []
    if architectures and not any(a.endswith("ForSequenceClassification") for a in architectures):
        raise NotARewardModel(
            f"{option} {path} is a {', '.join(architectures)}, not a reward model (no trained score head); "
            "give the reward-model stage's export"
        )


@dataclass
class Models:
    """The models of an evaluation, loaded once: the policy, its tokenizer, optional reference and RM, and
    the prompts as the policy reads them (:func:`policy_prompts`) and as given (``given``: read from their
    source, once each; None when none were given)."""

    tokenizer: object
    policy: torch.nn.Module
    reference: torch.nn.Module | None = None
    reward_model: torch.nn.Module | None = None
    prompts: RenderedPrompts | None = None
    given: list[TextOrConversation] | None = None


def load_models(
    policy: str,
    *,
    reference: str | None = None,
    reward_model: str | None = None,
    tokenizer: str | None = None,
    device: str = "cpu",
    prompts: Prompts | None = None,
    chat_template: TemplateOption = "auto",
    repeat: int = 1,
) -> Models:
    """Load the policy (with its tokenizer, left padding), and the reference and RM when given.

    The reference must share the policy's vocabulary (KL compares the same token ids) and so must
    the reward model (it reads the policy's ids as they are); both are refused otherwise.
    ``prompts`` (a list, a :class:`~rlhf_lit.data.prompt_source.PromptSource` or a set read for this tokenizer)
    are read and rendered with the tokenizer before any weights load (:func:`policy_prompts`, each ``repeat``
    times), so a prompt, a source or a ``chat_template`` the tokenizer cannot serve is refused first.
    """
    from rlhf_lit.data.prompt_source import as_prompt_set
    from rlhf_lit.models import load_causal_lm
    from rlhf_lit.models.reward_ensemble import load_any_reward_model
    from rlhf_lit.tokenizer import check_same_vocabulary, load_tokenizer

    tok = load_tokenizer(tokenizer or policy, padding_side="left", what="--tokenizer" if tokenizer else "--policy")
    given = None if prompts is None else as_prompt_set(prompts, tok, chat_template, "--prompts")
    rendered = None if given is None else policy_prompts(tok, given, chat_template, repeat)
    policy_model = load_causal_lm(policy, tok).to(device).eval()
    models = Models(tok, policy_model, prompts=rendered, given=None if given is None else given.prompts)
    if reference is not None and same_folder(reference, policy):
        models.reference = policy_model  # the policy against itself: its KL is 0 with no pass (sample_and_measure)
    elif reference is not None:
        check_same_tokenizer(tok, reference)
        models.reference = load_causal_lm(reference, tok).to(device).eval()
    if reward_model is not None:
        check_reward_model(reward_model)
        check_same_vocabulary(tok, reward_model, "--reward-model", models.policy.config.vocab_size)
        models.reward_model = load_any_reward_model(reward_model, tok).to(device).eval()
    return models


def policy_prompts(
    tokenizer, prompts: Sequence[TextOrConversation] | PromptSet, chat_template: TemplateOption, repeat: int = 1
) -> RenderedPrompts:
    """``prompts`` (a list, or a set read for this tokenizer, whose format a ``chat_template: auto`` follows) as
    the policy reads them (:mod:`rlhf_lit.data.prompt_rendering`, ``--chat-template``), each repeated ``repeat``
    times as consecutive rows; logs the one line saying how they were rendered."""
    from rlhf_lit.data.prompt_rendering import RenderedPrompts, prompt_rendering, render_prompts, rendering_line
    from rlhf_lit.data.prompt_source import as_prompt_set

    prompt_set = as_prompt_set(prompts, tokenizer, chat_template, "--prompts")
    rendering = prompt_rendering(chat_template, tokenizer, "--chat-template", prompt_set.format)
    log.info("%s", rendering_line(prompt_set.where, rendering, prompt_set.prompts))
    texts, ids, end_of_turn = render_prompts(tokenizer, prompt_set.prompts, rendering)
    return RenderedPrompts(
        [t for t in texts for _ in range(repeat)], [x for x in ids for _ in range(repeat)], end_of_turn
    )


@dataclass
class Samples:
    """Per-response measurements, row ``i`` answering ``prompts[i]`` (the prompt's text as the policy read
    it; KL and RM only with those models)."""

    prompts: list[str]
    responses: list[str] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    ended: list[bool] = field(default_factory=list)
    other_turns: list[bool] = field(default_factory=list)
    kls: list[float] | None = None
    rm_scores: list[float] | None = None


def check_prompt_lengths(
    models: Models, prompts: RenderedPrompts, max_new_tokens: int, unfinished: UnfinishedScoring
) -> None:
    """Refuse, before sampling, a row (the longest prompt and ``max_new_tokens``; the reward model's one longer
    when a cut response gets an end, ``with_eos``) longer than a model's learned position table
    (:func:`~rlhf_lit.models.positions.check_sequence_length`)."""
    from rlhf_lit.models.positions import check_sequence_length

    longest = max((len(ids) for ids in prompts.ids), default=0)
    where = f"the longest prompt, {longest} tokens, + max_new_tokens {max_new_tokens}"
    check_sequence_length([models.policy, models.reference], longest + max_new_tokens, where)
    end = unfinished == "with_eos"
    where += ", + the end a cut response gets (with_eos)" if end else ""
    check_sequence_length([models.reward_model], longest + max_new_tokens + end, where)


def sample_and_measure(
    models: Models,
    prompts: RenderedPrompts,
    sampling: SamplingConfig,
    *,
    batch_size: int,
    seed: int,
    unfinished: UnfinishedScoring = "as_sampled",
    precision: SamplingPrecision = "32-true",
) -> tuple[Samples, float]:
    """Sample one response per row of ``prompts`` (:func:`policy_prompts`: the policy reads its ids) and
    measure it; returns ``(samples, seconds sampling)``.

    Lengths count response tokens, EOS included. KL needs ``models.reference``, RM scores
    ``models.reward_model`` (non-finite scores are refused), which reads a response without EOS
    as ``unfinished`` says (:data:`~rlhf_lit.models.scoring.UnfinishedScoring`, PPO's ``reward.unfinished``).
    ``precision`` is the sampling's alone (:data:`~rlhf_lit.models.precision.SamplingPrecision`); the KL and
    the RM scores are computed in float32.
    """
    import time

    from rlhf_lit.evaluation import response_texts
    from rlhf_lit.evaluation.turns import holds_other_turn, marker_token_ids
    from rlhf_lit.models.generation import sample_batches, stop_token_ids
    from rlhf_lit.models.reward_ensemble import reward_scores
    from rlhf_lit.models.scoring import reward_model_rows
    from rlhf_lit.models.teacher_forced import response_logprobs

    check_prompt_lengths(models, prompts, sampling.max_new_tokens, unfinished)
    stop_ids = stop_token_ids(models.policy, models.tokenizer)
    # Appended to cut responses for the RM (with_eos): the id a response ended with in the RM's data: a chat
    # template's end of turn for prompts rendered with it, else the EOS.
    eos_id = stop_ids[0] if prompts.end_of_turn is None else prompts.end_of_turn
    markers = marker_token_ids(models.tokenizer, stop_ids)
    t0 = time.perf_counter()
    batches = sample_batches(
        models.policy, models.tokenizer, prompts.ids, sampling, batch_size=batch_size, seed=seed, precision=precision
    )
    seconds = time.perf_counter() - t0
    # Only the sampling above runs at `precision`; the scoring below stays float32, out of any autocast: the KL
    # is a sum of differences of log-probabilities that bf16's rounding (2^-8 of each) would swamp, and the
    # RM's scores decide best-of-N's pick and are the figures' numbers.
    out = Samples(list(prompts.texts))
    out.kls = [] if models.reference is not None else None
    out.rm_scores = [] if models.reward_model is not None else None
    for gen in batches:
        with torch.no_grad():
            if out.kls is not None and models.reference is models.policy:
                out.kls += [0.0] * gen.response_mask.shape[0]  # log pi - log pi, token by token
            elif out.kls is not None:
                logprobs = response_logprobs(models.policy, gen, sampling.temperature)  # (B, R)
                ref_logprobs = response_logprobs(models.reference, gen, sampling.temperature)  # (B, R)
                kl = torch.where(gen.response_mask, logprobs - ref_logprobs, 0.0).sum(-1)  # (B,)
                out.kls += kl.tolist()
            if out.rm_scores is not None:
                rows = reward_model_rows(gen, unfinished, eos_id, models.tokenizer.pad_token_id)  # (B, T [+ 1]) x2
                out.rm_scores += reward_scores(models.reward_model, *rows).tolist()  # an ensemble: the members' mean
        out.lengths += gen.response_mask.sum(-1).tolist()
        out.ended += gen.ended.tolist()
        texts = response_texts(models.tokenizer, gen.query_responses, gen.attention_mask, gen.response_mask, gen.ended)
        out.responses += texts
        out.other_turns += holds_other_turn(texts, gen.response_ids, gen.response_mask, markers)
    if out.rm_scores is not None and not all(math.isfinite(s) for s in out.rm_scores):
        raise ValueError("the reward model returned a non-finite score (NaN or inf); check the reward model")
    return out, seconds

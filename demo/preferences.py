"""Synthetic preference data: sample K completions per prompt, let a judge label pairs or rank them.

Output: a JSONL file. Pairings ``best_worst`` and ``all_pairs`` write one pair per line,
``{"prompt", "chosen", "rejected", "chosen_score", "rejected_score", "paragraph"}``, read by the
preference data module with ``format: fields``; ``ranking`` writes one prompt per line,
``{"prompt", "responses": [best, ..., worst], "ranks", "scores", "paragraph"}`` (``ranks``: lower
is better, equal is a tie; ``scores``: the judge's, in the same order), written by the library's
ranking writer (:func:`rlhf_lit.data.rankings.ranking_record`, as ``rlhf-lit iterate``'s labels) and read with
``format: rankings``. ``paragraph`` is the source paragraph's index, for checking that ranges stay
disjoint. ``prompt`` is the prompt string as given and a response is
decoded by :func:`rlhf_lit.evaluation.response_texts`, so ``prompt + chosen`` is the sampled text
whenever the tokenizer decodes the encoded prompt back to itself (true of every TinyStories prompt
with the demo's tokenizer).

The prompts come from a paragraph range of the stories (the toy demo), or from a prompts file
(``prompts_file``: the chat demo's one-turn conversations, :mod:`demo.chat_prompts`; any file
``rlhf-lit evaluate --prompts`` reads). A conversation is sampled inside the model's chat template with
its generation prompt (:mod:`rlhf_lit.data.prompt_rendering`), kept as the record's ``prompt``, and
``paragraph`` is then the prompt's index in the file; the judge reads the reply alone.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence

from demo.labeling import Labeler, Pairing, candidate_pairs, prefer_first, rank_samples
from demo.story_prompts import RANGES, load_prompts
from rlhf_lit.artifacts import write_jsonl_atomically
from rlhf_lit.data.conversation import TextOrConversation, is_conversation
from rlhf_lit.data.prompt_source import read_prompt_source
from rlhf_lit.data.rankings import RANKS_FIELD, count_ranked_pairs, distinct_responses, ranking_record
from rlhf_lit.evaluation import response_texts
from rlhf_lit.evaluation.judges import DEFAULT_JUDGE, load_judge
from rlhf_lit.evaluation.samples import policy_prompts
from rlhf_lit.models import load_causal_lm
from rlhf_lit.models.generation import SamplingConfig, sample_batches
from rlhf_lit.models.precision import SamplingPrecision
from rlhf_lit.tokenizer import load_tokenizer

log = logging.getLogger(__name__)

DEFAULT_BT_TEMPERATURE = 0.25
"""Bradley-Terry temperature for VADER scores (in [-1, 1]) when none is given."""


def label_pairs(
    paragraphs: Sequence[int],
    prompts: Sequence[str],
    responses: Sequence[str],
    scores: Sequence[float],
    samples_per_prompt: int,
    labeler: Labeler,
    pairing: Pairing,
    temperature: float,
    rng: random.Random,
) -> tuple[list[dict], int, int]:
    """Turn judged samples into preference records.

    Args:
        paragraphs: paragraph index of each prompt, ``(N,)``.
        prompts, responses, scores: one entry per sample, ``N * K`` entries grouped by prompt
            (the K samples of prompt ``n`` are entries ``n * K`` to ``n * K + K - 1``).
        samples_per_prompt: K.
        labeler, pairing, temperature: see :mod:`demo.labeling`.
        rng: the labeller's random source (``bradley_terry`` draws one number per pair).

    Returns:
        ``(records, ties, empty)``: the records in prompt order, the number of pairs dropped as
        ties, and the number dropped because a response is empty (EOS sampled at once): an empty
        response is no demonstration of anything, and the preference data module refuses it.
    """
    k = samples_per_prompt
    if not len(prompts) == len(responses) == len(scores) == len(paragraphs) * k:
        raise ValueError("prompts, responses and scores need K entries per paragraph")
    records, ties, empty = [], 0, 0
    for n, paragraph in enumerate(paragraphs):
        group = range(n * k, (n + 1) * k)
        group_scores = [scores[i] for i in group]
        for a, b in candidate_pairs(group_scores, pairing):
            ia, ib = group[a], group[b]
            if not responses[ia].strip() or not responses[ib].strip():
                empty += 1
                continue
            first = prefer_first(scores[ia], scores[ib], labeler, temperature, rng)
            if first is None:
                ties += 1
                continue
            chosen, rejected = (ia, ib) if first else (ib, ia)
            records.append(
                {
                    "prompt": prompts[chosen],
                    "chosen": responses[chosen],
                    "rejected": responses[rejected],
                    "chosen_score": scores[chosen],
                    "rejected_score": scores[rejected],
                    "paragraph": paragraph,
                }
            )
    return records, ties, empty


def label_rankings(
    paragraphs: Sequence[int],
    prompts: Sequence[str],
    responses: Sequence[str],
    scores: Sequence[float],
    samples_per_prompt: int,
    labeler: Labeler,
    temperature: float,
    rng: random.Random,
) -> tuple[list[dict], int, int]:
    """Turn judged samples into ranking records, one per prompt (:func:`rank_samples` orders them).

    Arguments as :func:`label_pairs`. Empty responses (EOS sampled at once) and repeats of an
    earlier sample's text leave the ranking first (a ranking's responses must differ), and the
    others are ranked; ``bradley_terry`` draws ``k - 1`` numbers for a prompt with ``k`` responses
    left, and none for a dropped prompt.

    Returns:
        ``(records, ties, empty)``: the records in prompt order, the number of prompts dropped
        because all their responses tie (``argmax``: no comparison left), and the number dropped
        because fewer than 2 distinct non-empty responses are left.
    """
    k = samples_per_prompt
    if not len(prompts) == len(responses) == len(scores) == len(paragraphs) * k:
        raise ValueError("prompts, responses and scores need K entries per paragraph")
    records, ties, empty = [], 0, 0
    for n, paragraph in enumerate(paragraphs):
        kept = [n * k + i for i in distinct_responses(responses[n * k : (n + 1) * k])]
        if len(kept) < 2:
            empty += 1
            continue
        if labeler == "argmax" and len({scores[i] for i in kept}) == 1:
            ties += 1
            continue
        kept_scores = [scores[i] for i in kept]
        order, ranks = rank_samples(kept_scores, labeler, temperature, rng)
        record = ranking_record(prompts[kept[0]], [responses[i] for i in kept], order, ranks, kept_scores)
        records.append({**record, "paragraph": paragraph})
    return records, ties, empty


def make_preferences(
    model: str,
    paragraphs: str,
    out: str,
    *,
    start: int = RANGES["reward_model"][0],
    count: int = RANGES["reward_model"][1],
    num_words: int = 8,
    samples_per_prompt: int = 2,
    labeler: Labeler = "argmax",
    pairing: Pairing = "best_worst",
    bt_temperature: float | None = None,
    judge: str = DEFAULT_JUDGE,
    sampling: SamplingConfig = SamplingConfig(max_new_tokens=48),
    batch_size: int = 64,
    seed: int = 0,
    tokenizer: str | None = None,
    device: str = "cpu",
    rankings_out: str | None = None,
    prompts_file: str | None = None,
    precision: SamplingPrecision = "32-true",
) -> dict:
    """Sample, judge and label; write the preference JSONL to ``out``.

    Args:
        model: the SFT model directory (or hub name) to sample from.
        paragraphs: blank-line separated text file of stories (not read with ``prompts_file``).
        out: JSONL file to write (parent directories are created).
        start, count: the paragraphs ``[start, start + count)`` whose openings are the prompts.
        num_words: words of each paragraph used as the prompt.
        samples_per_prompt: K >= 2 completions per prompt.
        labeler: ``argmax`` (higher judge score wins, ties dropped) or ``bradley_terry``.
        pairing: ``best_worst`` (one pair per prompt), ``all_pairs`` (K (K - 1) / 2 pairs) or
            ``ranking`` (one ranking record of the K samples per prompt).
        bt_temperature: Bradley-Terry temperature in judge-score units, ``bradley_terry`` only
            (None there means :data:`DEFAULT_BT_TEMPERATURE`): a score gap of ``bt_temperature``
            is preferred with probability sigmoid(1) = 0.73.
        judge: judge spec ``module:function``.
        sampling: sampling settings.
        batch_size: completions per ``generate`` call (changing it changes the samples of a seed).
        seed: sampling seed (see :func:`rlhf_lit.models.generation.sample_batches`); it also seeds the
            labeller.
        tokenizer: tokenizer location when not beside the model.
        device: torch device.
        rankings_out: also write the ranking records of the same samples and judge scores here
            (the same labeller, seeded as ``out``'s): pairs for DPO and rankings for the RM from
            one labelling cost.
        prompts_file: the prompts instead of a paragraph range (``start``, ``count`` and
            ``num_words`` are then not read): a prompt source
            (:func:`rlhf_lit.data.prompt_source.read_prompt_source`), strings or conversations.
        precision: how the model samples, ``32-true`` or ``bf16-mixed`` (bf16 autocast around ``generate``,
            :func:`rlhf_lit.models.precision.sampling_precision`); the judge scores the texts as it always does.

    Returns:
        Counts and timings: prompts, samples, records (pairs or rankings written), pairs (the
        comparisons they hold, ties excluded), ties, empty (see :func:`label_pairs` and
        :func:`label_rankings`), judge_mean, precision (how it sampled), seconds; with ``rankings_out`` also ``rankings``
        (ranking records written there).
    """
    if samples_per_prompt < 2:
        raise ValueError(f"samples_per_prompt must be >= 2 to form pairs, got {samples_per_prompt}")
    if labeler == "argmax" and bt_temperature is not None:
        raise ValueError("bt_temperature only applies to labeler='bradley_terry'; drop it or switch labeler")
    temperature = DEFAULT_BT_TEMPERATURE if bt_temperature is None else bt_temperature
    t0 = time.perf_counter()
    if prompts_file is not None:
        prompts = read_prompt_source(prompts_file).prompts
        indices = list(range(len(prompts)))
    else:
        indices, prompts = load_prompts(paragraphs, start, count, num_words)
    samples = sample_and_judge(
        model,
        indices,
        prompts,
        samples_per_prompt=samples_per_prompt,
        judge=judge,
        sampling=sampling,
        batch_size=batch_size,
        seed=seed,
        tokenizer=tokenizer,
        device=device,
        precision=precision,
    )
    records, ties, empty = label(samples, samples_per_prompt, labeler, pairing, temperature, random.Random(seed))
    write_jsonl_atomically(out, records)
    rankings = None
    if rankings_out is not None:
        rankings, _, _ = label(samples, samples_per_prompt, labeler, "ranking", temperature, random.Random(seed))
        write_jsonl_atomically(rankings_out, rankings)
    scores = samples["scores"]
    stats = {
        "prompts": len(samples["paragraphs"]),
        "samples": len(scores),
        "records": len(records),
        "pairs": sum(count_pairs(r) for r in records),
        "ties": ties,
        "empty": empty,
        "judge_mean": sum(scores) / len(scores),
        "precision": precision,
        "seconds": time.perf_counter() - t0,
        **({} if rankings is None else {"rankings": len(rankings)}),
    }
    log.info("wrote %d records to %s (%s)", len(records), out, stats)
    return stats


def sample_and_judge(
    model: str,
    indices: Sequence[int],
    prompts: Sequence[TextOrConversation],
    *,
    samples_per_prompt: int,
    judge: str,
    sampling: SamplingConfig,
    batch_size: int,
    seed: int,
    tokenizer: str | None,
    device: str,
    precision: SamplingPrecision = "32-true",
) -> dict[str, list]:
    """Sample K completions of each prompt and judge each reply once (other arguments as :func:`make_preferences`).

    Args:
        indices: each prompt's index (its paragraph, or its line in the prompts file), ``(N,)``.
        prompts: ``(N,)`` strings (sampled as they are) or conversations (sampled in the model's chat
            template with its generation prompt).

    Returns ``{"paragraphs": (N,), "prompts", "responses", "scores": (N * K,) grouped by prompt}``,
    what :func:`label` takes.
    """
    judge_fn = load_judge(judge)
    tok = load_tokenizer(tokenizer or model, padding_side="left")
    lm = load_causal_lm(model, tok).to(device).eval()
    repeated = [p for p in prompts for _ in range(samples_per_prompt)]
    # A conversation reaches the model as the one rule for prompts outside the data modules renders it.
    inputs = policy_prompts(tok, repeated, "auto").ids if any(map(is_conversation, prompts)) else repeated
    responses = []
    for gen in sample_batches(lm, tok, inputs, sampling, batch_size=batch_size, seed=seed, precision=precision):
        responses += response_texts(tok, gen.query_responses, gen.attention_mask, gen.response_mask, gen.ended)
    return {
        "paragraphs": list(indices),
        "prompts": [list(p) if is_conversation(p) else p for p in repeated],  # a conversation as JSON writes it
        "responses": responses,
        "scores": list(judge_fn(responses)),
    }


def label(
    samples: dict[str, list],
    samples_per_prompt: int,
    labeler: Labeler,
    pairing: Pairing,
    temperature: float,
    rng: random.Random,
) -> tuple[list[dict], int, int]:
    """:func:`label_rankings` for ``pairing="ranking"``, else :func:`label_pairs`, of :func:`sample_and_judge`'s output."""
    args = (samples["paragraphs"], samples["prompts"], samples["responses"], samples["scores"], samples_per_prompt)
    if pairing == "ranking":
        return label_rankings(*args, labeler, temperature, rng)
    return label_pairs(*args, labeler, pairing, temperature, rng)


def count_pairs(record: dict) -> int:
    """Comparisons a record holds: 1 for a pair, the untied pairs of a ranking's ``ranks``."""
    return count_ranked_pairs(record[RANKS_FIELD]) if RANKS_FIELD in record else 1

"""What ``rlhf-lit evaluate`` and ``rlhf-lit best-of-n`` share: prompts files, models, sampling, scores, JSON.

Sampling is the library's (:func:`rlhf_lit.models.generation.sample_batches`: one seeded generator,
left-padded batches), KL is the per-response sum over response tokens (EOS included) of
``logprob_policy - logprob_ref`` at the sampling temperature
(:func:`rlhf_lit.models.generation.response_logprobs`), the reward is the reward model's score at
the last response token plus its stored normalisation offset (as the PPO stage reads it), and
responses are decoded as every judge reads them (:func:`rlhf_lit.evaluation.response_texts`).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

log = logging.getLogger(__name__)

PromptFormat = Literal["auto", "lines", "jsonl"]
"""``lines``: one prompt per non-blank line; ``jsonl``: one JSON object per line; ``auto``: by extension."""

WRITTEN_BY_KEY = "written_by"
"""Key of the marker in every JSON a command writes (``"rlhf-lit <command>"``): ``--overwrite`` replaces only such files."""


class OptionError(ValueError):
    """A bad option value: reported as ``rlhf-lit: error: ...`` with exit status 2."""


class CommandParser(argparse.ArgumentParser):
    """An argparse parser whose errors read like the rest of rlhf-lit: one ``rlhf-lit: error:`` line, exit 2."""

    def error(self, message: str):
        """Print ``rlhf-lit: error: <message>`` and where the options are listed; exit 2."""
        self.exit(2, f"rlhf-lit: error: {message}\n(`{self.prog} --help` lists the options)\n")


def mean_std(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and population standard deviation (the demo's convention)."""
    mean = sum(xs) / len(xs)
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))


def read_prompts(path: str, fmt: PromptFormat = "auto", field_name: str = "prompt") -> list[str]:
    """The prompts of a file, in file order; a ``ValueError`` names the file (and line) when it is unusable.

    Args:
        path: a text file (one prompt per line; blank lines skipped, the line kept as written
            without its line break) or JSONL (one object per non-blank line, the prompt in
            ``field_name``).
        fmt: ``auto`` reads ``*.jsonl`` as JSONL and anything else as lines.
        field_name: the JSONL field that holds the prompt.
    """
    if not os.path.isfile(path):
        raise ValueError(f"--prompts {path}: no such file")
    if fmt == "auto":
        fmt = "jsonl" if path.endswith(".jsonl") else "lines"
    prompts = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            if fmt == "lines":
                prompts.append(line)
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} line {number}: not JSON ({e.msg})") from None
            if not isinstance(record, dict) or field_name not in record:
                raise ValueError(f"{path} line {number}: no {field_name!r} field (choose it with --prompt-field)")
            prompt = record[field_name]
            if not isinstance(prompt, str) or not prompt.strip():
                raise ValueError(f"{path} line {number}: {field_name!r} is not a non-empty string")
            prompts.append(prompt)
    if not prompts:
        raise ValueError(f"{path}: no prompts in the file")
    return prompts


def check_out(path: str | None, overwrite: bool) -> None:
    """Refuse an ``--out`` that would destroy a file (before any work): raises :class:`OptionError`.

    An existing file is replaced only with ``overwrite`` and only if an rlhf-lit command wrote it
    (its JSON carries the ``written_by`` marker); a directory is never replaced.
    """
    if path is None or not os.path.lexists(path):
        return
    if os.path.isdir(path):
        raise OptionError(f"--out {path} is a directory; give a JSON file name")
    if not overwrite:
        raise OptionError(f"--out {path} exists; pass --overwrite to replace it, or choose another file")
    try:
        with open(path, encoding="utf-8") as f:
            written_by = json.load(f).get(WRITTEN_BY_KEY, "")
    except (OSError, ValueError, AttributeError):
        written_by = ""
    if not str(written_by).startswith("rlhf-lit "):
        raise OptionError(f"--out {path} exists and was not written by rlhf-lit; it is not replaced even with --overwrite")


def write_json(path: str, result: dict) -> None:
    """Write ``result`` to ``path`` atomically (a temporary file beside it, then renamed)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".rlhf-lit-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1, ensure_ascii=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def check_same_tokenizer(tokenizer, reference: str) -> None:
    """Raise if the reference ships a tokenizer with another vocabulary than the policy's.

    KL compares logprobs of the same token ids, so both models must share one vocabulary. A
    reference directory without tokenizer files is taken to use the policy's tokenizer.
    """
    from rlhf_lit.tokenizer import load_tokenizer

    try:
        ref_tok = load_tokenizer(reference)
    except (OSError, ValueError):
        log.info("no tokenizer in %s: assuming it uses the policy's", reference)
        return
    if ref_tok.get_vocab() != tokenizer.get_vocab():
        raise ValueError(
            f"the reference {reference!r} has another tokenizer vocabulary than the policy "
            f"({len(ref_tok)} vs {len(tokenizer)} tokens); KL needs one vocabulary"
        )


def check_reward_model(path: str) -> None:
    """Refuse a ``--reward-model`` saved as another kind of model (a causal LM has no trained score head).

    Loading one as a reward model would give it a fresh random head: scores that mean nothing.
    """
    from transformers import AutoConfig

    architectures = getattr(AutoConfig.from_pretrained(path), "architectures", None) or []
    if architectures and not any(a.endswith("ForSequenceClassification") for a in architectures):
        raise ValueError(
            f"--reward-model {path} is a {', '.join(architectures)}, not a reward model (no trained score head); "
            "give the reward-model stage's export"
        )


@dataclass
class Models:
    """The models of an evaluation, loaded once: the policy, its tokenizer, optional reference and RM."""

    tokenizer: object
    policy: torch.nn.Module
    reference: torch.nn.Module | None = None
    reward_model: torch.nn.Module | None = None


def load_models(
    policy: str,
    *,
    reference: str | None = None,
    reward_model: str | None = None,
    tokenizer: str | None = None,
    device: str = "cpu",
) -> Models:
    """Load the policy (with its tokenizer, left padding), and the reference and RM when given.

    The reference must share the policy's vocabulary (KL compares the same token ids) and so must
    the reward model (it reads the policy's ids as they are); both are refused otherwise.
    """
    from rlhf_lit.models import load_causal_lm, load_reward_model
    from rlhf_lit.tokenizer import check_same_vocabulary, load_tokenizer

    tok = load_tokenizer(tokenizer or policy, padding_side="left", what="--tokenizer" if tokenizer else "--policy")
    models = Models(tok, load_causal_lm(policy, tok).to(device).eval())
    if reference is not None:
        check_same_tokenizer(tok, reference)
        models.reference = load_causal_lm(reference, tok).to(device).eval()
    if reward_model is not None:
        check_reward_model(reward_model)
        check_same_vocabulary(tok, reward_model, "--reward-model", models.policy.config.vocab_size)
        models.reward_model = load_reward_model(reward_model, tok).to(device).eval()
    return models


@dataclass
class Samples:
    """Per-response measurements, row ``i`` answering ``prompts[i]`` (KL and RM only with those models)."""

    prompts: list[str]
    responses: list[str] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    ended: list[bool] = field(default_factory=list)
    kls: list[float] | None = None
    rm_scores: list[float] | None = None


def sample_and_measure(
    models: Models, prompts: Sequence[str], sampling, *, batch_size: int, seed: int, unfinished: str = "as_sampled"
) -> tuple[Samples, float]:
    """Sample one response per entry of ``prompts`` and measure it; returns ``(samples, seconds sampling)``.

    Lengths count response tokens, EOS included. KL needs ``models.reference``, RM scores
    ``models.reward_model`` (non-finite scores are refused), which reads a response without EOS
    as ``unfinished`` says (:data:`~rlhf_lit.models.scoring.UnfinishedScoring`, PPO's ``reward.unfinished``).
    """
    import time

    from rlhf_lit.evaluation import response_texts
    from rlhf_lit.models import sequence_scores
    from rlhf_lit.models.generation import response_logprobs, sample_batches, stop_token_ids
    from rlhf_lit.models.reward_norm import reward_offset
    from rlhf_lit.models.scoring import reward_model_rows

    eos_id = stop_token_ids(models.policy, models.tokenizer)[0]  # appended to cut responses for the RM (with_eos)
    t0 = time.perf_counter()
    batches = sample_batches(models.policy, models.tokenizer, prompts, sampling, batch_size=batch_size, seed=seed)
    seconds = time.perf_counter() - t0
    out = Samples(list(prompts))
    out.kls = [] if models.reference is not None else None
    out.rm_scores = [] if models.reward_model is not None else None
    for gen in batches:
        with torch.no_grad():
            if out.kls is not None:
                logprobs = response_logprobs(models.policy, gen, sampling.temperature)  # (B, R)
                ref_logprobs = response_logprobs(models.reference, gen, sampling.temperature)  # (B, R)
                kl = torch.where(gen.response_mask, logprobs - ref_logprobs, 0.0).sum(-1)  # (B,)
                out.kls += kl.tolist()
            if out.rm_scores is not None:
                rows = reward_model_rows(gen.query_responses, gen.attention_mask, gen.ended, unfinished, eos_id,
                                         models.tokenizer.pad_token_id)  # fmt: skip
                rm = sequence_scores(models.reward_model, *rows)  # (B,)
                out.rm_scores += (rm.float() + reward_offset(models.reward_model.config)).tolist()
        out.lengths += gen.response_mask.sum(-1).tolist()
        out.ended += gen.ended.tolist()
        out.responses += response_texts(
            models.tokenizer, gen.query_responses, gen.attention_mask, gen.response_mask, gen.ended
        )  # fmt: skip
    if out.rm_scores is not None and not all(math.isfinite(s) for s in out.rm_scores):
        raise ValueError("the reward model returned a non-finite score (NaN or inf); check the reward model")
    return out, seconds


def add_unfinished_option(parser: argparse.ArgumentParser) -> None:
    """``--unfinished``: how ``--reward-model`` reads a response that did not end (PPO's ``reward.unfinished``)."""
    from typing import get_args

    from rlhf_lit.models.scoring import UnfinishedScoring

    parser.add_argument("--unfinished", choices=get_args(UnfinishedScoring), default="as_sampled",
                        help="how the reward model reads a response cut at --max-new-tokens: as sampled, or with EOS "
                        "appended (as rlhf-lit's RM stage trained it; PPO's reward.unfinished)")  # fmt: skip


def add_common_options(parser: argparse.ArgumentParser, *, max_new_tokens: int, batch_size: int) -> None:
    """Options both commands take: prompts, tokenizer, sampling, seed, device, output."""
    from rlhf_lit.evaluation.judges import DEFAULT_JUDGE

    parser.add_argument("--prompts", required=True, metavar="FILE",
                        help="prompts: one per line, or JSONL (*.jsonl) with the prompt in --prompt-field")
    parser.add_argument("--prompt-field", default="prompt", help="JSONL field holding the prompt")
    parser.add_argument("--prompt-format", choices=["auto", "lines", "jsonl"], default="auto",
                        help="auto: *.jsonl is JSONL, anything else one prompt per line")
    parser.add_argument("--max-prompts", type=int, default=None, metavar="K", help="use only the first K prompts")
    parser.add_argument("--judge", default=None, metavar="MODULE:FUNCTION",
                        help=f"judge scoring each response text, higher is better (e.g. {DEFAULT_JUDGE}); none by default")
    parser.add_argument("--tokenizer", default=None, metavar="DIR", help="tokenizer when not beside the policy")
    parser.add_argument("--max-new-tokens", type=int, default=max_new_tokens, help="most tokens per response")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (KL logprobs use it too)")
    parser.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens; 0 = off")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold; 1.0 = off")
    parser.add_argument("--batch-size", type=int, default=batch_size,
                        help="responses per generate call (changing it changes the samples of a seed)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    parser.add_argument("--out", default=None, metavar="FILE.json", help="JSON file for the result (never replaces a file "
                        "rlhf-lit did not write)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if an earlier rlhf-lit run wrote it")


def sampling_from(args: argparse.Namespace):
    """The :class:`~rlhf_lit.models.generation.SamplingConfig` of the options (bad values: :class:`OptionError`)."""
    from rlhf_lit.models.generation import SamplingConfig

    try:
        return SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                              top_p=args.top_p)  # fmt: skip
    except ValueError as e:
        raise OptionError(str(e).replace("sampling.", "--").replace("_", "-")) from None


def check_positive(**values: int | None) -> None:
    """Raise :class:`OptionError` for an option (given as ``name=value``, ``_`` for ``-``) below 1."""
    for name, value in values.items():
        if value is not None and value < 1:
            raise OptionError(f"--{name.replace('_', '-')} must be >= 1, got {value}")


def check_sources(**paths: str | None) -> None:
    """Refuse a local model path that does not exist or is not a directory (``name=path``; hub names pass)."""
    from rlhf_lit.sources import _looks_local

    for name, path in paths.items():
        if path is None:
            continue
        option = f"--{name.replace('_', '-')}"
        expanded = os.path.expanduser(path)
        if os.path.exists(expanded) and not os.path.isdir(expanded):
            raise ValueError(f"{option} {path}: not a directory (give the model directory)")
        if not os.path.exists(expanded) and _looks_local(path):
            raise ValueError(f"{option} {path}: no such directory")


def prepare(args: argparse.Namespace, **sources: str | None) -> tuple[list[str], object, object | None]:
    """Every check a command makes before loading a model: ``(prompts, sampling, judge or None)``."""
    from rlhf_lit.evaluation.judges import load_judge

    check_positive(batch_size=args.batch_size, max_prompts=args.max_prompts)
    sampling = sampling_from(args)
    check_out(args.out, args.overwrite)
    check_sources(**sources)
    prompts = read_prompts(args.prompts, args.prompt_format, args.prompt_field)
    if args.max_prompts is not None:
        prompts = prompts[: args.max_prompts]
    judge = load_judge(args.judge) if args.judge else None
    return prompts, sampling, judge

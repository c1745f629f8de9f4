"""Loading causal LMs and reward models from a hub name or a local directory."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from rlhf_lit.models.kernels import fuse_activations
from rlhf_lit.sources import DamagedSource, SourceError, from_pretrained

log = logging.getLogger(__name__)

DType = Literal["auto", "float32", "bfloat16", "float16"]

AttnImplementation = str | None
"""The stages' ``attn_implementation`` option: the attention kernel every model of the stage is loaded with,
passed to ``from_pretrained`` as it is (``eager``, ``sdpa``, ``flash_attention_2``, ``flex_attention``, or
any other name transformers takes); None: transformers' default for the model (``sdpa`` where it exists)."""


def _torch_dtype(dtype: DType) -> torch.dtype | str:
    return "auto" if dtype == "auto" else getattr(torch, dtype)


@dataclass(frozen=True)
class ModelLoading:
    """How a model is read by ``from_pretrained``: the one set of loading options that every load of a
    stage passes (policy, reference, reward model or ensemble members, critic) and the commands' loads too.

    A stage builds it once from its options (``dtype``, ``revision``, ``trust_remote_code``,
    ``attn_implementation``) and hands it to :func:`load_causal_lm`, :func:`load_reward_model` and the
    loaders built on them; a load that differs (PPO's frozen models in ``memory.frozen_dtype``) is
    :meth:`but` the changed field, never a second set of arguments.

    Args:
        dtype: weight dtype (:data:`DType`).
        revision: hub revision (a branch, tag or commit); ignored for a local directory.
        trust_remote_code: allow model code from the hub.
        attn_implementation: the attention kernel (:data:`AttnImplementation`); None: transformers' default.
    """

    dtype: DType = "float32"
    revision: str | None = None
    trust_remote_code: bool = False
    attn_implementation: AttnImplementation = None

    def but(self, **changes: Any) -> ModelLoading:
        """A copy with ``changes`` (field names) applied."""
        return dataclasses.replace(self, **changes)

    def from_pretrained_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``from_pretrained``: every field, the dtype as torch's."""
        return {
            "dtype": _torch_dtype(self.dtype),
            "revision": self.revision,
            "trust_remote_code": self.trust_remote_code,
            "attn_implementation": self.attn_implementation,
        }


def _attention_error(loading: ModelLoading, what: str, name_or_path: str, error: Exception) -> ValueError | None:
    """The one message for a model that does not load with ``loading.attn_implementation`` (transformers
    raises ``ImportError`` for a kernel whose package is missing, ``ValueError`` for a name it does not
    know), naming the option; None when ``error`` is about something else."""
    impl, text = loading.attn_implementation, str(error)
    if impl is None or not any(word in text.lower() for word in ("attn", "attention")):
        return None  # another failure (a remote-code import, a damaged file): the loader's own message
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(error).__name__)
    return ValueError(
        f"attn_implementation {impl!r}: {what} {name_or_path} cannot be loaded with it ({first}); leave "
        "attn_implementation unset (null) for transformers' default, or choose eager or sdpa"
    )


def disable_dropout(model: nn.Module) -> None:
    """Switch off every dropout of ``model``, in train mode too.

    PPO ratios and KL estimates assume the same function is evaluated in rollout and update;
    dropout would make old and new logprobs differ before any update (N implementation details #8).
    Two kinds exist: ``nn.Dropout`` modules (GPT-2's ``attn_pdrop``, ``resid_pdrop``), whose ``p``
    is set to 0, and plain float attributes that code reads in train mode (Llama's
    ``self.attention_dropout``, copied from ``config.attention_dropout``, passed to a functional
    dropout; OPT's ``layerdrop``), which are set to 0.0. The config itself is left as it was, so an
    exported model keeps the checkpoint's settings.
    """
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            module.p = 0.0
        for name, value in vars(module).items():
            if isinstance(value, float) and "drop" in name:  # dropout, attn_pdrop, layerdrop, drop_path
                setattr(module, name, 0.0)


def _fit_to_tokenizer(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> None:
    """Grow the embeddings if the tokenizer gained tokens (an added pad) and record the pad id."""
    if tokenizer is None:
        return
    embeddings = model.get_input_embeddings()
    if embeddings is not None and len(tokenizer) > embeddings.num_embeddings:
        log.warning(
            "resizing token embeddings %d -> %d to fit the tokenizer", embeddings.num_embeddings, len(tokenizer)
        )
        model.resize_token_embeddings(len(tokenizer))
    model.config.pad_token_id = tokenizer.pad_token_id
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id


class _HeldLoadReport(logging.Filter):
    """Holds back transformers' "LOAD REPORT" record (a table of missing / unexpected / mismatched weights)
    while a model loads: kept in ``records`` for the caller to print, check or drop."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        """False (held) for the load report, True for every other record."""
        if "LOAD REPORT" in str(record.msg):
            self.records.append(record)
            return False
        return True


@contextlib.contextmanager
def _holding_load_report() -> Iterator[_HeldLoadReport]:
    """Hold transformers' load report while loading (:class:`_HeldLoadReport`)."""
    logger, held = logging.getLogger("transformers.modeling_utils"), _HeldLoadReport()
    logger.addFilter(held)
    try:
        yield held
    finally:
        logger.removeFilter(held)


_MISMATCH = re.compile(
    r"^\s*(\S+)\s*\|\s*MISMATCH\s*\|.*?ckpt:\s*torch\.Size\((\[[^]]*\])\).*?model:\s*torch\.Size\((\[[^]]*\])\)"
)


def mismatched_weights(report: str) -> list[str]:
    """``name: the file holds [shape], config.json makes [shape]`` for each MISMATCH row of a load report."""
    rows = (_MISMATCH.match(line) for line in report.splitlines())
    return [f"{m[1]}: the weights hold {m[2]}, config.json makes {m[3]}" for m in rows if m]


def _shape_error(what: str, name_or_path: str, held: _HeldLoadReport) -> SourceError | None:
    """The one-line refusal of weights whose shapes are not those the folder's config.json gives (another
    ``vocab_size`` or ``hidden_size`` written into it), from the held load report; None without one."""
    mismatched = [row for record in held.records for row in mismatched_weights(record.getMessage())]
    if not mismatched:
        return None
    more = f" (and {len(mismatched) - 1} more)" if len(mismatched) > 1 else ""
    return DamagedSource(
        f"{what} {name_or_path!r} cannot be loaded: its weights do not have the shapes its config.json gives "
        f"({mismatched[0]}{more}); restore config.json from the export it came with"
    )


def _is_score_head(key: str) -> bool:
    """Whether a weight name belongs to a sequence-classification head (``score`` / ``classifier``)."""
    return key.split(".")[0] in ("score", "classifier")


def _load(
    auto_class: type,
    name_or_path: str,
    tokenizer: PreTrainedTokenizerBase | None,
    loading: ModelLoading,
    keep_dropout: bool,
    new_head: bool = False,
    **kwargs,
) -> PreTrainedModel:
    """Load with ``auto_class``, fit the embeddings to the tokenizer, switch dropout off and use fused
    activation kernels (:func:`fuse_activations`, the same function).

    With ``new_head`` the checkpoint is expected to lack the score head: transformers' report of
    that missing head is not printed (it would advise training a head the caller is about to
    initialise and train), and any *other* missing, unexpected or mismatched weight is still
    reported, as a warning of our own. A model that does not load with ``loading.attn_implementation``
    raises :func:`_attention_error`'s one message.
    """
    what = "reward model" if auto_class is AutoModelForSequenceClassification else "model"
    with _holding_load_report() as held:
        try:
            loaded = from_pretrained(
                auto_class.from_pretrained,
                name_or_path,
                what,
                **loading.from_pretrained_kwargs(),
                output_loading_info=new_head,
                **kwargs,
            )
        except (ImportError, ValueError) as error:
            wrapped = _attention_error(loading, what, name_or_path, error)
            if wrapped is None:
                raise
            raise wrapped from None
        except RuntimeError as error:  # weights of other shapes: the report says which, the error only "see above"
            wrapped = _shape_error(what, name_or_path, held)
            if wrapped is None:
                raise
            raise wrapped from error
    if not new_head:  # the report of a load that worked is printed as transformers prints it
        logger = logging.getLogger("transformers.modeling_utils")
        for record in held.records:
            logger.handle(record)
    model = loaded[0] if new_head else loaded
    if new_head:
        info = loaded[1]
        surprises = {
            kind: [k for k in info.get(kind) or [] if not _is_score_head(str(k))]
            for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")
        }
        if any(surprises.values()):
            log.warning(
                "%s %s: weights not as expected besides the new score head: %s",
                what,
                name_or_path,
                {k: v for k, v in surprises.items() if v},
            )
    _fit_to_tokenizer(model, tokenizer)
    if not keep_dropout:
        disable_dropout(model)
    fuse_activations(model)
    return model


def load_causal_lm(
    name_or_path: str,
    tokenizer: PreTrainedTokenizerBase | None = None,
    loading: ModelLoading = ModelLoading(),
    keep_dropout: bool = False,
) -> PreTrainedModel:
    """Load an ``AutoModelForCausalLM`` and prepare it for RLHF.

    Args:
        name_or_path: Hugging Face hub name or local directory.
        tokenizer: The run's tokenizer; embeddings are resized if it is larger than the vocab.
        loading: dtype, revision, remote code and attention kernel (:class:`ModelLoading`). Keep the
            dtype ``float32`` with ``precision="bf16-mixed"``.
        keep_dropout: Keep the checkpoint's dropout (off by default, see :func:`disable_dropout`).
    """
    return _load(AutoModelForCausalLM, name_or_path, tokenizer, loading, keep_dropout)


def load_reward_model(
    name_or_path: str,
    tokenizer: PreTrainedTokenizerBase | None = None,
    loading: ModelLoading = ModelLoading(),
    keep_dropout: bool = False,
    new_head: bool = False,
) -> PreTrainedModel:
    """Load an ``AutoModelForSequenceClassification`` with one label as a reward model.

    A causal-LM checkpoint (for example the SFT result) gets a fresh score head, which the
    reward stage initialises N(0, 1/sqrt(d+1)) with :func:`init_reward_head`. Arguments as in
    :func:`load_causal_lm`; ``new_head=True`` says the caller knows the checkpoint has no score
    head and creates one on purpose, so transformers' "score.weight MISSING" report is not shown
    (other missing weights still are). A frozen reward model is loaded without it: there a missing
    head is a mistake worth the report.
    """
    args = (name_or_path, tokenizer, loading, keep_dropout, new_head)
    return _load(AutoModelForSequenceClassification, *args, num_labels=1)


def has_score_head(name_or_path: str, what: str = "model", loading: ModelLoading = ModelLoading()) -> bool:
    """True when the checkpoint is a sequence-classification model: it ships its own score head (else
    :func:`load_reward_model` creates one). ``what`` names it in errors; its config is read at
    ``loading``'s revision, with its remote code."""
    config = from_pretrained(
        AutoConfig.from_pretrained,
        name_or_path,
        what,
        revision=loading.revision,
        trust_remote_code=loading.trust_remote_code,
    )
    return any(a.endswith("ForSequenceClassification") for a in config.architectures or [])


def init_reward_head(head: nn.Linear) -> None:
    """Initialise a fresh reward head N(0, 1/sqrt(d+1)), bias 0 (Ziegler et al. 2019, N details #4)."""
    d = head.in_features
    nn.init.normal_(head.weight, std=1.0 / (d + 1) ** 0.5)
    if head.bias is not None:
        nn.init.zeros_(head.bias)

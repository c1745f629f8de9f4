"""LoRA adapters (via ``peft``) on a loaded Hugging Face model: the one place they are applied.

:func:`with_lora` wraps a causal LM (the SFT or PPO policy) or a sequence-classification model
(the reward model, a separate critic) with ``peft.get_peft_model``. The stages keep holding the
Hugging Face model itself (its linear layers now carry the adapters), so every forward, ``generate``
and scoring helper works unchanged; the ``peft`` wrapper stays reachable through
:func:`peft_model_of` for what only it can do: switching the adapter off (the PPO reference, see
:mod:`rlhf_lit.models.reference`) and writing the adapter (:func:`exportable`).

Only the adapter weights (and a reward model's ``score`` head) require gradients, so the stages'
optimizers, which skip frozen parameters, train nothing else.

Under FSDP2 (:mod:`rlhf_lit.models.sharding`) the adapted model is sharded like any other; the
export then starts from its gathered weights (:func:`export_parts`), and :func:`adapter_disabled`
keeps the shards' ``requires_grad`` as it was.
"""

from __future__ import annotations

import copy
import itertools
import logging
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.pytorch_utils import Conv1D

from rlhf_lit.option_values import check_finite, check_least

log = logging.getLogger(__name__)

LoRAExport = Literal["merged", "adapter"]
"""``merged``: the adapter folded into full weights (loads with plain ``from_pretrained``);
``adapter``: the ``peft`` adapter alone plus the tokenizer (loads with
``peft.PeftModel.from_pretrained(base, dir)`` or ``AutoPeftModelForCausalLM.from_pretrained(dir)``)."""

LoRATask = Literal["causal_lm", "reward"]
"""``causal_lm``: a policy; ``reward``: a sequence-classification model whose ``score`` head trains in full."""

ARCHITECTURE_TARGETS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gpt2-style", ("c_attn", "c_proj", "c_fc")),
    ("llama-style", ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
)

"""Default target modules by name pattern: the first family whose names all occur in a model wins
(GPT-2 / GPT-J-style fused projections; Llama, Mistral, Qwen and their kin). Other models get
every linear layer except the output head."""

_ADAPTABLE = (nn.Linear, Conv1D, nn.Embedding)
"""Layer types peft's LoRA adapts here (GPT-2's projections are ``Conv1D``)."""
_HANDLE = "_rlhf_lit_lora"
"""Attribute of the Hugging Face model that holds its :class:`_LoRAHandle` (set without registering
a submodule, so state dicts and ``modules()`` are unchanged)."""


@dataclass(frozen=True)
class LoRAConfig:
    """Low-rank adapters (Hu et al. 2021) on the model's projection layers, via ``peft``.

    Args:
        r: rank of each adapter (``A`` is ``r x in``, ``B`` is ``out x r``; ``B`` starts at 0, so
            the adapted model starts equal to the base model).
        alpha: scaling numerator: the update is ``(alpha / r) * B A``.
        dropout: dropout on the adapter's input. Must stay 0 in PPO (the ratio must be exactly 1
            at the first minibatch; PPO refuses anything else); SFT and RM may use it.
        target_modules: names (a module's name or the last part of it, e.g. ``q_proj``) of the
            layers that get adapters; None = the default for the architecture, chosen by name
            patterns (:data:`ARCHITECTURE_TARGETS`; otherwise every linear layer except the head).
        export: what the stage's export writes (:data:`LoRAExport`).
    """

    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: list[str] | None = None
    export: LoRAExport = "merged"

    def __post_init__(self) -> None:
        if not isinstance(self.r, int) or self.r < 1:
            raise ValueError(f"lora.r must be an integer >= 1, got {self.r!r}")
        check_least("lora.alpha", self.alpha, 0, strict=True)
        check_finite("lora.alpha", self.alpha)  # the adapters' scale alpha / r
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout!r}")
        if self.export not in ("merged", "adapter"):
            raise ValueError(f"lora.export must be 'merged' or 'adapter', got {self.export!r}")
        if self.target_modules is not None and (
            len(self.target_modules) == 0 or not all(isinstance(t, str) and t for t in self.target_modules)
        ):
            raise ValueError(
                f"lora.target_modules must be null or a non-empty list of names, got {self.target_modules!r}"
            )


@dataclass
class _LoRAHandle:
    """What :func:`with_lora` leaves on the Hugging Face model: the peft wrapper and the export choice."""

    peft_model: nn.Module
    export: LoRAExport


def _head_names(model: PreTrainedModel) -> set[str]:
    """Full module names of the output heads (LM head, score head): never adapted by default."""
    heads = {id(m) for m in (model.get_output_embeddings(), getattr(model, "score", None)) if m is not None}
    return {name for name, module in model.named_modules() if id(module) in heads}


def default_target_modules(model: PreTrainedModel) -> list[str]:
    """The default adapter targets of ``model`` (see :data:`ARCHITECTURE_TARGETS`), as short names."""
    heads = _head_names(model)
    layers = {name: m for name, m in model.named_modules() if isinstance(m, (nn.Linear, Conv1D)) and name not in heads}
    short = {name.rsplit(".", 1)[-1] for name in layers}
    for _, names in ARCHITECTURE_TARGETS:
        if set(names) <= short:
            return list(names)
    if not short:
        raise ValueError(f"lora: {type(model).__name__} has no linear layer outside its head to adapt")
    return sorted(short)


def resolve_target_modules(model: PreTrainedModel, config: LoRAConfig) -> list[str]:
    """``config.target_modules`` checked against ``model`` (or the default); one message per mistake."""
    if config.target_modules is None:
        return default_target_modules(model)
    modules = dict(model.named_modules())
    for target in config.target_modules:
        matched = [m for name, m in modules.items() if name == target or name.endswith("." + target)]
        if not matched:
            linear = sorted({n.rsplit(".", 1)[-1] for n, m in modules.items() if isinstance(m, (nn.Linear, Conv1D))})
            raise ValueError(
                f"lora.target_modules: no module of {type(model).__name__} matches {target!r} "
                f"(its linear layers are named: {', '.join(linear)})"
            )
        wrong = [type(m).__name__ for m in matched if not isinstance(m, _ADAPTABLE)]
        if wrong:
            raise ValueError(
                f"lora.target_modules: {target!r} names a {wrong[0]} in {type(model).__name__}; "
                "LoRA adapts linear (or embedding) layers only"
            )
    return list(config.target_modules)


def with_lora(model: PreTrainedModel, config: LoRAConfig | None, task: LoRATask) -> PreTrainedModel:
    """``model`` with LoRA adapters on its target modules and every other weight frozen.

    Returns the same Hugging Face model object (its layers now hold the adapters); None as
    ``config`` returns it untouched, so callers need no branch. For ``task="reward"`` the ``score``
    head stays trainable in full (a fresh head has nothing to adapt).

    Raises:
        ValueError: bad ``lora.*`` settings (naming the option).
        ImportError: ``peft`` is not installed (the ``lora`` extra).
    """
    if config is None:
        return model
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as err:  # an optional extra: say which
        raise ImportError("lora needs the peft package: pip install 'rlhf-lit[lora]'") from err
    targets = resolve_target_modules(model, config)
    fused = any(isinstance(m, Conv1D) and n.rsplit(".", 1)[-1] in targets for n, m in model.named_modules())
    peft_config = LoraConfig(
        r=config.r,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=targets,
        fan_in_fan_out=fused,  # GPT-2's Conv1D stores (in, out) weights
        # No task type for the RM: peft's sequence-classification wrapper would replace `score` by a
        # ModulesToSaveWrapper, and the scoring helpers read `score` as a plain linear layer.
        task_type="CAUSAL_LM" if task == "causal_lm" else None,
    )
    peft_model = get_peft_model(model, peft_config)
    base = peft_model.get_base_model()
    if task == "reward":
        base.score.requires_grad_(True)  # the head trains in full (it is small and often fresh)
    source = getattr(base.config, "_name_or_path", "") or ""
    if source and Path(source).is_dir():  # an adapter export names its base by absolute path
        peft_model.peft_config["default"].base_model_name_or_path = str(Path(source).resolve())
    object.__setattr__(base, _HANDLE, _LoRAHandle(peft_model, config.export))
    trainable = sum(p.numel() for p in base.parameters() if p.requires_grad)
    total = sum(p.numel() for p in base.parameters())
    log.info("LoRA r=%d on %s: %d of %d parameters trainable", config.r, ", ".join(targets), trainable, total)
    return base


def peft_model_of(model: nn.Module) -> nn.Module | None:
    """The ``peft.PeftModel`` that :func:`with_lora` put around ``model``; None for a plain model."""
    handle = getattr(model, "__dict__", {}).get(_HANDLE)
    return None if handle is None else handle.peft_model


@contextmanager
def adapter_disabled(model: nn.Module):
    """Run ``model`` as its base weights: the adapters are switched off inside the block.

    ``model`` must carry adapters (:func:`with_lora`); a plain model raises ValueError, so a
    reference can never silently be the trained policy itself.

    peft freezes the adapters on entry and unfreezes them on exit, each time on the parameters
    ``model`` holds at that moment. Under FSDP2 these are the shards or the gathered copies, by
    the unit's state (a root unit keeps its weights gathered after a no-grad pass), so the shards
    frozen on entry could stay frozen; the trainable parameters held on entry are unfrozen again here.
    """
    peft_model = peft_model_of(model)
    if peft_model is None:
        raise ValueError(f"{type(model).__name__} has no LoRA adapter to disable")
    trainable = [p for p in model.parameters() if p.requires_grad]
    try:
        with peft_model.disable_adapter():
            yield model
    finally:
        for param in trainable:
            param.requires_grad_(True)


def exportable(model: nn.Module) -> nn.Module:
    """What a stage's export should ``save_pretrained``: the model itself, or for a LoRA model a
    merged copy (full weights; the live model is never merged) or the peft adapter, as configured."""
    handle = getattr(model, "__dict__", {}).get(_HANDLE)
    if handle is None:
        return model
    if handle.export == "adapter":
        return handle.peft_model
    # A copy: merging in place would change the model a running fit (or a caller) still uses.
    return _merged(copy.deepcopy(handle.peft_model))


def export_parts(model: nn.Module, weights: dict[str, torch.Tensor] | None) -> tuple[nn.Module, dict | None]:
    """What to ``save_pretrained`` and with which weights: ``(module, state_dict or None)``.

    ``weights``: the gathered whole weights of a sharded ``model`` (FSDP, see
    :func:`rlhf_lit.models.sharding.full_state_dict`), None for an unsharded one. A plain model is
    written with them as they are. A LoRA model's merge or adapter needs peft's own layers holding
    whole weights, so a sharded one is rebuilt unsharded around ``weights`` first
    (:func:`_unsharded_copy`), then merged in place (the copy is ours) or written as the adapter.
    """
    handle = getattr(model, "__dict__", {}).get(_HANDLE)
    if handle is None:
        return model, weights
    if weights is None:
        return exportable(model), None
    peft_model = _unsharded_copy(model, handle, weights)
    return (peft_model if handle.export == "adapter" else _merged(peft_model)), None


def _merged(peft_model: nn.Module) -> nn.Module:
    """``peft_model``'s adapters folded into its base weights (in place): a plain Hugging Face model.

    A tied input embedding / LM head with an adapter on either is untied first (:func:`_untie_adapted`).
    """
    _untie_adapted(peft_model.get_base_model())
    merged = peft_model.merge_and_unload()
    merged.__dict__.pop(_HANDLE, None)
    return merged


def _untie_adapted(model: PreTrainedModel) -> None:
    """Give the LM head its own copy of the weight it shares with the input embedding, when an adapter
    sits on either of the two (in place; ``config.tie_word_embeddings`` set False to match).

    Tied embeddings are one weight under two modules; peft adapts the module it is given, not its
    twin, so the trained model already computes the two apart (one with its adapter, one with the base
    weight). Merging into the shared weight would put the adapter into both, and the export would not
    be the trained model (SmolLM2, small adapters: 0.26 of a logit apart). Untied, each keeps what it
    computed. Without an adapter on either (the default targets) the model stays tied.
    """
    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    if inputs is None or outputs is None:
        return
    raw_in, raw_out = getattr(inputs, "base_layer", inputs), getattr(outputs, "base_layer", outputs)
    adapted = raw_in is not inputs or raw_out is not outputs  # peft's LoRA layers wrap a base_layer
    if not adapted or raw_out.weight is not raw_in.weight:
        return
    raw_out.weight = nn.Parameter(raw_out.weight.detach().clone(), requires_grad=raw_out.weight.requires_grad)
    model.config.tie_word_embeddings = False
    text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else None
    if text_config is not None:
        text_config.tie_word_embeddings = False


def _tie_again(model: PreTrainedModel) -> None:
    """``model.tie_weights()``, or, when peft wraps the input embedding or the LM head, the same tie made
    between the wrapped base layers: transformers' own tie assigns ``weight`` on the wrapper, where it
    is a read-only property (KeyError "attribute 'weight' already exists")."""
    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    raw_in = getattr(inputs, "base_layer", inputs)
    raw_out = getattr(outputs, "base_layer", outputs)
    if inputs is None or outputs is None or (raw_in is inputs and raw_out is outputs):
        model.tie_weights()
    elif getattr(model.config.get_text_config(), "tie_word_embeddings", False):
        raw_out.weight = raw_in.weight


def _unsharded_copy(model: nn.Module, handle: _LoRAHandle, weights: dict[str, torch.Tensor]) -> nn.Module:
    """A new, unsharded peft model like ``handle.peft_model`` holding ``weights`` (``model``'s state dict).

    FSDP forbids deep copies of a sharded model, so the copy is built again: the Hugging Face class
    (the one FSDP2 subclassed) from ``model``'s config and the adapters from the same peft config,
    on the meta device (no memory, no random init); ``weights``' tensors then become its parameters
    and persistent buffers (``assign``: no second copy), and the live model's non-persistent buffers
    (rotary frequencies: in no state dict, and never sharded) are copied to the CPU beside them.
    """
    from peft import get_peft_model
    from torch.distributed.fsdp import FSDPModule

    hf_class = next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))
    peft_config = copy.deepcopy(handle.peft_model.peft_config["default"])
    with torch.device("meta"):
        peft_model = get_peft_model(hf_class(copy.deepcopy(model.config)), peft_config)
    base = peft_model.get_base_model()
    base.load_state_dict(weights, assign=True)
    for name, buffer in model.named_buffers():
        if name not in weights:
            owner, _, leaf = name.rpartition(".")
            base.get_submodule(owner)._buffers[leaf] = buffer.detach().cpu()  # keeps the copy's persistence flag
    _tie_again(base)  # assign=True replaced tied parameters one by one: tie them again, as in the live model
    left = [n for n, t in itertools.chain(base.named_parameters(), base.named_buffers()) if t.is_meta]
    if left:
        raise RuntimeError(
            f"the unsharded copy of {hf_class.__name__} lacks {len(left)} weights ({', '.join(left[:3])})"
        )
    return peft_model

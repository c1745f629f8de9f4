"""Padding-free passes: the rows of a padded batch packed into one sequence (``ppo.remove_padding``).

A rollout's rows are padded to the longest prompt on the left and the longest response on the
right, and a padded forward pass spends its matmuls on every padding column. Packed, the real
tokens of all rows form one sequence ``(1, N)`` whose position ids restart at 0 for each row; the
model's attention mask builder (transformers' ``create_causal_mask``, given ``position_ids`` and no
``attention_mask``) reads the restarts and lets each token attend only to the tokens of its own
row. The outputs at the real tokens are those of the padded pass up to the order of float sums,
for the work of ``N`` tokens instead of ``B x T`` (what OpenRLHF calls packing samples and verl
``use_remove_padding``).

Whether a model packs correctly is checked once per model, on the model itself, before its first
packed pass (:func:`packs_correctly`): an architecture whose mask ignores the restarts (tokens
attending across rows) or whose positions ignore ``position_ids`` fails the check and keeps the
padded pass, with one warning. Compiled passes (``ppo.forward: compiled``) stay padded: their
graphs are specialised to bucketed row shapes.
"""

from __future__ import annotations

import contextvars
import logging
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

log = logging.getLogger(__name__)

_ENABLED: contextvars.ContextVar[bool] = contextvars.ContextVar("rlhf_lit_remove_padding", default=False)
_CHECKED: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


@contextmanager
def padding_free(enabled: bool = True) -> Iterator[None]:
    """Within the block, the teacher-forced passes that support it run packed (:func:`packing_applies`)."""
    token = _ENABLED.set(enabled)
    try:
        yield
    finally:
        _ENABLED.reset(token)


@dataclass
class PackedRows:
    """The real tokens of left/right-padded rows as one sequence.

    Attributes:
        input_ids: ``(1, N)`` the real tokens, row after row.
        position_ids: ``(1, N)`` each token's position in its row (from 0; the positions the padded
            pass gives it, ``cumsum(mask) - 1``).
        index: ``(B, T)`` long, each real token's place in the packed sequence; -1 on padding.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    index: torch.Tensor

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """``(1, N, ...)`` outputs back to ``(B, T, ...)``, zeros on padding (differentiable)."""
        return gather_rows(packed[0], self.index)


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> PackedRows:
    """Pack the attended tokens of ``(B, T)`` rows (any padding side) into one sequence."""
    real = attention_mask.bool()  # (B, T)
    flat = real.flatten()  # (B*T,)
    index = torch.where(real, flat.long().cumsum(0).view_as(real) - 1, -1)  # (B, T)
    positions = real.long().cumsum(-1) - 1  # (B, T)
    return PackedRows(input_ids[real].unsqueeze(0), positions[real].unsqueeze(0), index)


def gather_rows(packed: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``packed (K, ...)`` placed at ``index (B, R)`` (a place in ``packed`` or -1): ``(B, R, ...)``,
    zeros where the index is -1. Differentiable in ``packed``."""
    valid = index >= 0  # (B, R)
    return place_rows(packed[index[valid]], valid)


def place_rows(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``values (K, ...)``, one per True of ``valid (B, R)`` in row-major order, at those places of a
    ``(B, R, ...)`` tensor of zeros. Differentiable in ``values``."""
    out = values.new_zeros((valid.numel(), *values.shape[1:]))  # (B*R, ...)
    out = out.index_put((torch.nonzero(valid.flatten()).squeeze(1),), values)
    return out.view(*valid.shape, *values.shape[1:])


def packing_applies(model: nn.Module, attention_mask: torch.Tensor) -> bool:
    """Whether a teacher-forced pass of ``model`` over rows masked by ``attention_mask`` runs packed:
    inside :func:`padding_free`, eager (not while compiling), a 2-D mask, and a model that passes
    :func:`packs_correctly`."""
    if torch.compiler.is_compiling():  # first: a compiled graph cannot read the context variable
        return False
    if not _ENABLED.get() or attention_mask.dim() != 2:
        return False
    return packs_correctly(model)


def packs_correctly(model: nn.Module) -> bool:
    """Whether ``model`` gives a packed pass the padded pass's outputs (checked once per model).

    Two rows, one left-padded, are run padded and packed; the last hidden states of their real
    tokens must agree to 1e-3 of their magnitude in float32 (rounding differs by ~1e-6), 5e-2 in
    16-bit (~1e-2); a token attending across rows, or positions that ignore ``position_ids``,
    differ by tens of percent.
    """
    verdict = _CHECKED.get(model)
    if verdict is None:
        verdict = _check(model)
        _CHECKED[model] = verdict
        if not verdict:
            log.warning(
                "[rlhf-lit] %s does not pack rows correctly (its attention mask ignores position-id restarts): "
                "its passes keep the padding (ppo.remove_padding has no effect on it)",
                type(model).__name__,
            )
    return verdict


@torch.no_grad()
def _check(model: nn.Module) -> bool:
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embeddings is None:
        return False
    device = embeddings.weight.device
    vocab = embeddings.num_embeddings
    ids = (torch.arange(12, device=device).view(2, 6) * 7 + 3) % vocab  # (2, 6)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], device=device)  # (2, 6)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (2, 6)
    try:
        padded = model(
            input_ids=ids, attention_mask=mask, position_ids=positions, output_hidden_states=True, use_cache=False
        ).hidden_states[-1]  # (2, 6, D)
        rows = pack_rows(ids, mask)
        packed = model(
            input_ids=rows.input_ids, position_ids=rows.position_ids, output_hidden_states=True, use_cache=False
        ).hidden_states[-1]  # (1, 10, D)
    except (TypeError, ValueError, RuntimeError) as err:  # a forward that takes no position_ids, ...
        log.debug("packing check of %s failed: %s", type(model).__name__, err)
        return False
    expected = padded[mask.bool()].float()  # (10, D)
    if packed.shape[1] != expected.shape[0]:
        return False
    scale = expected.abs().max().clamp(min=1e-6)
    full_precision = embeddings.weight.dtype == torch.float32 and not torch.is_autocast_enabled(device.type)
    return bool(((packed[0].float() - expected).abs().max() / scale) < (1e-3 if full_precision else 5e-2))

"""Running the frozen bottom of a model once per sequence: the ``cache_frozen`` speed lever.

With ``trainable_layers: N`` the blocks below the top N never change, so their output for a sequence
is the same every time it is read: in every epoch of a reward model, in DPO's policy pass and its
reference's pass (the reference is the policy's start: the same frozen blocks), in PPO's scoring and
its update epochs. :class:`TrunkCaches` keeps that output (the *trunk*: the embeddings and the frozen
blocks) per sequence and lets a later pass run only the blocks above it.

How it works, with no architecture named:

- each frozen block's ``forward`` is wrapped on the instance (the state dict, checkpoints and exports
  are untouched); outside a cached pass the wrapper calls the block as before (generation with a KV
  cache, packed rows, any call the cache does not recognise);
- a forward pre-hook on the model recognises a teacher-forced pass over a padded batch (``input_ids``
  and a 2-D ``attention_mask`` as keywords, positions counting real tokens, no KV cache). For each row
  it looks up the row's real tokens; a row not yet kept is computed **alone, unpadded** (a pass of the
  model that stops after the last frozen block), so a kept value depends only on the row's tokens, the
  weights and the autocast setting, never on which rows shared its batch: a run resumed mid-epoch
  reads exactly what the uninterrupted run read;
- in the pass itself the frozen blocks below the last hand their input on unchanged and the last
  returns the kept rows, scattered to the batch's padding (zeros at pads, which no real token attends to).

Models whose frozen part is bit-for-bit the same (the same parameters and buffers, dtype and device:
a DPO policy and its reference, PPO's policy, reference, reward model and critic when all start from
one model) share one store. A check at attach time runs a probe batch with and without the cache and
refuses a model the mechanism does not reproduce. Kept rows are float32 on the model's device: memory
is the tokens kept x the hidden size x 4 bytes (the chat demo's reward model: about 0.9 GB).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterable
from typing import Any, Literal

import torch
from torch import nn

from rlhf_lit.models.freezing import modules_run_before, transformer_blocks

TrunkFill = Literal["alone", "batch"]
"""How a row missing from the store is computed in a pass: ``alone`` (unpadded, by itself: what is kept
depends only on the row, so rows kept across steps read the same after a resume) or ``batch`` (with the
other missing rows of the pass, as padded there: for a store emptied before any step could be resumed
into, PPO's per rollout). :meth:`TrunkCaches.prefill` computes a known set of rows in batches either way."""


class _TrunkRecorded(Exception):  # noqa: N818 - a signal, not an error: the recording pass stops here
    """Raised by the last frozen block in a recording pass, carrying its output."""

    def __init__(self, hidden: torch.Tensor) -> None:
        super().__init__()
        self.hidden = hidden


def _hidden_of(output: Any) -> torch.Tensor:
    """The hidden states of a block's output: the tensor itself, or the first item of a tuple."""
    return output if isinstance(output, torch.Tensor) else output[0]


def _autocast_key(device: torch.device) -> str:
    """The autocast setting a trunk value was computed under on ``device``'s type (part of its key)."""
    kind = device.type
    if torch.is_autocast_enabled(kind):
        return f"{kind}:{torch.get_autocast_dtype(kind)}"
    return f"{kind}:off"


def trunk_fingerprint(model: nn.Module, frozen_blocks: int, probe_output: torch.Tensor) -> str:
    """A hash of what the trunk's output depends on: the class of the block stack, the count of frozen
    blocks, the parameters and buffers (values, dtype, device) of the modules run before the blocks and
    of the frozen blocks, and the trunk's output on a fixed probe row (``probe_output``: what settings
    outside the tensors change, a norm's eps, rope's scaling, the attention kernel). Equal
    fingerprints, one store."""
    blocks = transformer_blocks(model)
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{type(blocks[0]).__name__}/{frozen_blocks}".encode())
    for module in [*modules_run_before(model, blocks[0]), *blocks[:frozen_blocks]]:
        for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
            digest.update(f"{name}:{tensor.dtype}:{tensor.device}:{tuple(tensor.shape)}".encode())
            digest.update(_bytes(tensor))
    digest.update(_bytes(probe_output))
    return digest.hexdigest()


def _bytes(tensor: torch.Tensor) -> bytes:
    """A tensor's raw bytes (on the CPU)."""
    return tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()


class _Attachment:
    """The cache's hooks on one model: its frozen blocks' wrapped forwards and its pre- and post-hooks."""

    def __init__(
        self, model: nn.Module, frozen_blocks: int, store: dict[tuple[str, bytes], torch.Tensor], fill: TrunkFill
    ) -> None:
        self.model, self.store, self.fill = model, store, fill
        self.blocks = transformer_blocks(model)
        self.frozen = frozen_blocks
        self.recording = False  # a row computed alone: stops after the last frozen block
        self.idle = False  # the probe's plain pass: hooks and blocks as if not attached
        self.ready: torch.Tensor | None = None  # the batch's trunk output while a cached pass runs
        self.returns_tuple = False
        self.hits = self.misses = 0
        for index, block in enumerate(self.blocks[:frozen_blocks]):
            block.forward = functools.partial(self._block_forward, index, block.forward)
        self.handles = [
            model.register_forward_pre_hook(self._before, with_kwargs=True),
            model.register_forward_hook(self._after, always_call=True),
        ]

    def remove(self) -> None:
        """Restore the blocks' own forwards and remove the hooks."""
        for block in self.blocks[: self.frozen]:
            block.__dict__.pop("forward", None)
        for handle in self.handles:
            handle.remove()

    # ----- the frozen blocks ---------------------------------------------------------------------

    def _block_forward(self, index: int, forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.ready is None:  # not a cached pass: the block as it is
            output = forward(*args, **kwargs)
            if self.recording and index == self.frozen - 1:
                self.returns_tuple = not isinstance(output, torch.Tensor)
                raise _TrunkRecorded(_hidden_of(output))
            return output
        hidden = self.ready if index == self.frozen - 1 else (args[0] if args else kwargs["hidden_states"])
        return (hidden,) if self.returns_tuple else hidden

    # ----- the model -----------------------------------------------------------------------------

    @staticmethod
    def cacheable(kwargs: dict[str, Any]) -> bool:
        """Whether a call is a teacher-forced pass over a padded batch whose positions count real tokens."""
        ids, mask, positions = kwargs.get("input_ids"), kwargs.get("attention_mask"), kwargs.get("position_ids")
        if not (
            isinstance(ids, torch.Tensor) and isinstance(mask, torch.Tensor) and isinstance(positions, torch.Tensor)
        ):
            return False
        if ids.dim() != 2 or mask.shape != ids.shape or kwargs.get("use_cache") is not False:
            return False
        if kwargs.get("past_key_values") is not None or kwargs.get("inputs_embeds") is not None:
            return False
        if kwargs.get("output_hidden_states") or kwargs.get("output_attentions"):  # the skipped blocks' own
            return False
        expected = (mask.long().cumsum(-1) - 1).clamp(min=0)
        return positions.shape == ids.shape and bool(torch.equal(positions, expected))

    def _before(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        self.ready = None
        if self.recording or self.idle or args or not self.cacheable(kwargs):
            return
        ids, mask = kwargs["input_ids"], kwargs["attention_mask"].bool()
        autocast = _autocast_key(ids.device)
        rows = [ids[i][mask[i]] for i in range(ids.shape[0])]
        keys = [(autocast, row.cpu().numpy().tobytes()) for row in rows]
        missing = {key: i for i, key in reversed(list(enumerate(keys))) if key not in self.store}  # first row of a key
        self.hits += len(keys) - len(missing)
        self.misses += len(missing)
        if missing and self.fill == "batch":  # the batch's missing rows together, as they are padded here
            index = torch.tensor(list(missing.values()), device=ids.device)
            self.store.update(zip(missing, self.record_batch(ids[index], mask[index])))
        else:
            for key, i in missing.items():
                self.store[key] = self.record(rows[i])
        first = self.store[keys[0]]
        ready = torch.zeros((*ids.shape, first.shape[-1]), dtype=first.dtype, device=first.device)
        for i, key in enumerate(keys):
            ready[i, mask[i]] = self.store[key]
        self.ready = ready

    def _after(self, module: nn.Module, args: tuple, output: Any) -> None:
        if not self.recording:  # a row's recording pass ends inside the outer pass, which keeps its rows
            self.ready = None

    def record(self, row: torch.Tensor) -> torch.Tensor:
        """The trunk's output ``(n, D)`` for one row of ``n`` real tokens, computed alone (no padding)."""
        n = row.shape[0]
        self.recording = True
        try:
            with torch.no_grad():
                self.model(
                    input_ids=row[None],
                    attention_mask=torch.ones(1, n, dtype=torch.long, device=row.device),
                    position_ids=torch.arange(n, device=row.device)[None],
                    use_cache=False,
                )
        except _TrunkRecorded as recorded:
            return recorded.hidden[0].detach()
        finally:
            self.recording = False
        raise RuntimeError(f"cache_frozen: {type(self.model).__name__}'s forward did not reach its frozen blocks")

    def record_batch(self, ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
        """The trunk's output of each row of a padded batch ``(B, T)``, ``(n_i, D)`` at its real tokens."""
        self.recording = True
        try:
            with torch.no_grad():
                self.model(
                    input_ids=ids,
                    attention_mask=mask.long(),
                    position_ids=(mask.long().cumsum(-1) - 1).clamp(min=0),
                    use_cache=False,
                )
        except _TrunkRecorded as recorded:
            real = mask.bool()
            return [recorded.hidden[i][real[i]].detach() for i in range(ids.shape[0])]
        finally:
            self.recording = False
        raise RuntimeError(f"cache_frozen: {type(self.model).__name__}'s forward did not reach its frozen blocks")


class TrunkCaches:
    """The frozen trunks' outputs of a stage's models, one store per distinct trunk (see the module
    docstring). :meth:`attach` a model with its count of frozen blocks; :meth:`clear` empties every
    store (PPO, at each rollout); :meth:`remove` takes every hook off."""

    def __init__(self, fill: TrunkFill = "alone") -> None:
        self.fill = fill
        self.prefilled = 0
        self.stores: dict[str, dict[tuple[str, bytes], torch.Tensor]] = {}
        self.attachments: list[_Attachment] = []

    def attach(self, model: nn.Module, frozen_blocks: int) -> None:
        """Keep the trunk of ``model`` (its embeddings and bottom ``frozen_blocks`` blocks, which must
        never train). Raises ``ValueError`` when those blocks train or apply dropout, or when a probe
        batch read through the cache differs from the plain pass (an architecture the cache cannot skip
        blocks of)."""
        blocks = transformer_blocks(model)
        if not 1 <= frozen_blocks < len(blocks):
            raise ValueError(
                f"cache_frozen: {frozen_blocks} frozen blocks of {len(blocks)}; set trainable_layers below "
                f"{len(blocks)}"
            )
        if any("forward" in block.__dict__ for block in blocks):
            raise ValueError(f"cache_frozen: {type(model).__name__} is already attached to a trunk cache")
        frozen = [*modules_run_before(model, blocks[0]), *blocks[:frozen_blocks]]
        if any(p.requires_grad for module in frozen for p in module.parameters()):
            raise ValueError("cache_frozen: the blocks below trainable_layers must be frozen (no parameter training)")
        for module in frozen:
            for sub in module.modules():
                if isinstance(sub, nn.modules.dropout._DropoutNd) and sub.p > 0:
                    raise ValueError(
                        f"cache_frozen: {type(model).__name__} applies dropout below its trainable blocks "
                        f"(p = {sub.p}); a kept output must be the same every pass"
                    )
        attachment = _Attachment(model, frozen_blocks, {}, self.fill)
        try:
            device = next(model.parameters()).device
            with torch.autocast(device.type, enabled=False):
                probe_output = attachment.record(torch.tensor([1, 3, 5, 7, 9, 11, 13, 15], device=device))
            attachment.store = self.stores.setdefault(trunk_fingerprint(model, frozen_blocks, probe_output), {})
            self._probe(attachment)
        except Exception:
            attachment.remove()
            raise
        self.attachments.append(attachment)

    @staticmethod
    def _probe(attachment: _Attachment) -> None:
        """Compare one padded probe batch's output with and without the cache (fp32, no autocast)."""
        model = attachment.model
        device = next(model.parameters()).device
        ids = torch.tensor([[7, 11, 13, 17, 19, 23], [0, 0, 29, 31, 37, 41]], device=device)
        mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]], device=device)
        kwargs = dict(
            input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0), use_cache=False
        )
        probe_store: dict[tuple[str, bytes], torch.Tensor] = {}
        kept, attachment.store = attachment.store, probe_store
        outputs: list[torch.Tensor] = []  # the top block's output, plain then cached
        handle = attachment.blocks[-1].register_forward_hook(lambda m, a, out: outputs.append(_hidden_of(out)))
        try:
            with torch.no_grad(), torch.autocast(device.type, enabled=False):
                attachment.idle = True  # the plain pass: hooks idle, blocks as they are
                try:
                    model(**kwargs)
                finally:
                    attachment.idle = False
                model(**kwargs)
        finally:
            attachment.store = kept
            handle.remove()
        plain, cached = outputs
        if not probe_store:
            raise ValueError(f"cache_frozen: {type(model).__name__}'s pass was not recognised as cacheable")
        real = mask.bool()
        if not torch.allclose(plain[real].float(), cached[real].float(), rtol=1e-3, atol=1e-4):
            raise ValueError(
                f"cache_frozen: {type(model).__name__} gives other outputs when its frozen blocks are skipped "
                "(its blocks do not pass hidden states straight from one to the next); leave cache_frozen off"
            )

    @torch.no_grad()
    def prefill(self, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], rows_per_pass: int = 16) -> int:
        """Compute, in every store, the rows of ``batches`` (``(input_ids, attention_mask)`` pairs) it
        lacks, in an order of their own: the distinct rows sorted by length and tokens, ``rows_per_pass``
        at a time, right padded. What is kept then depends on the set of rows alone, never on the order a
        data loader gives them or where a resumed run starts, and costs a padded batch's share per row
        where a row computed alone costs about twice that. Runs under the caller's autocast. Returns the
        rows computed."""
        rows: dict[bytes, torch.Tensor] = {}
        for ids, mask in batches:
            real = mask.bool()
            for i in range(ids.shape[0]):
                row = ids[i][real[i]]
                rows.setdefault(row.cpu().numpy().tobytes(), row)
        computed = 0
        for store in self.stores.values():
            attachment = next(a for a in self.attachments if a.store is store)
            device = next(attachment.model.parameters()).device
            autocast = _autocast_key(device)
            todo = sorted(((len(r), b, r) for b, r in rows.items() if (autocast, b) not in store), key=lambda t: t[:2])
            for start in range(0, len(todo), rows_per_pass):
                chunk = [r.to(device) for _, _, r in todo[start : start + rows_per_pass]]
                width = max(len(r) for r in chunk)
                ids = torch.zeros(len(chunk), width, dtype=chunk[0].dtype, device=device)
                mask = torch.zeros(len(chunk), width, dtype=torch.long, device=device)
                for i, r in enumerate(chunk):
                    ids[i, : len(r)], mask[i, : len(r)] = r, 1
                for (_, key, _), hidden in zip(todo[start : start + rows_per_pass], attachment.record_batch(ids, mask)):
                    store[(autocast, key)] = hidden
            computed += len(todo)
        self.prefilled += computed
        return computed

    def clear(self) -> None:
        """Forget every kept trunk output (the hooks stay)."""
        for store in self.stores.values():
            store.clear()

    def remove(self) -> None:
        """Take the hooks off every attached model and forget what was kept."""
        for attachment in self.attachments:
            attachment.remove()
        self.attachments.clear()
        self.clear()

    def statistics(self) -> dict[str, float]:
        """Rows read from the stores and rows computed in a pass, over every attached model; rows computed by
        :meth:`prefill`; the bytes kept."""
        kept = sum(t.numel() * t.element_size() for store in self.stores.values() for t in store.values())
        return {
            "hits": float(sum(a.hits for a in self.attachments)),
            "misses": float(sum(a.misses for a in self.attachments)),
            "prefilled": float(self.prefilled),
            "bytes": float(kept),
        }

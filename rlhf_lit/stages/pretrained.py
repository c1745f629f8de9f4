"""The base of the stages that fine-tune one pretrained model: :class:`PretrainedStage`.

SFT, the reward model, DPO and BoNBoN load one model by name with the same loading, LoRA and export
options, and may train only its top blocks (``trainable_layers``), keeping the frozen part's output
per sequence (``cache_frozen``, :mod:`rlhf_lit.models.trunk_cache`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import asdict

import torch
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.utils.data import DataLoader

from rlhf_lit.functional.ranking import batch_examples
from rlhf_lit.models.freezing import (
    check_frozen_modules,
    check_trainable_layers,
    freeze_lower_layers,
    freeze_modules,
    transformer_blocks,
)
from rlhf_lit.models.loading import AttnImplementation, DType, ModelLoading
from rlhf_lit.models.lora import LoRAConfig, with_lora
from rlhf_lit.models.memory import enable_gradient_checkpointing
from rlhf_lit.models.trunk_cache import TrunkCaches
from rlhf_lit.stages.base import StageModule, as_config, stage_tokenizer
from rlhf_lit.stages.export import ExportExisting
from rlhf_lit.tokenizer import MissingPad

log = logging.getLogger(__name__)


def dataset_batches(loader: DataLoader) -> Iterator[dict]:
    """The batches of ``loader``'s dataset in index order, collated as the loader collates (its batch
    size, or one item per batch when the dataset holds batches); nothing for a dataset without a length."""
    dataset, collate = loader.dataset, loader.collate_fn
    if not hasattr(dataset, "__len__"):
        return
    size = loader.batch_size
    if size is None:
        for i in range(len(dataset)):
            yield collate(dataset[i])
        return
    for start in range(0, len(dataset), size):
        yield collate([dataset[i] for i in range(start, min(start + size, len(dataset)))])


class PretrainedStage(StageModule):
    """A stage that fine-tunes one pretrained model it loads by name: SFT, the reward model, DPO.

    Such a stage's constructor takes ``model`` and its own settings and passes the rest on as
    ``**stage_args``: the loading, LoRA and export arguments below, the same for all three (the
    command line and ``--model.help`` list them with each stage).

    Args:
        tokenizer: Hub name or directory of the tokenizer; None uses ``model``'s.
        missing_pad: What to do when the tokenizer has no pad token (``add`` a new one, reuse
            ``eos`` / ``unk``, or ``error``); embeddings grow when a token is added.
        dtype: Weight dtype (of the trained model, and of DPO's reference). Keep ``float32``
            together with ``precision="bf16-mixed"``.
        export_dir: Where the final model and tokenizer are written at the end of fit, in Hugging
            Face format; None means ``<log dir or default_root_dir>/model``.
        export_existing: when ``export_dir`` already holds an earlier rlhf-lit export: ``refuse``
            (stop before training) or ``replace`` it (atomically, at the end of fit). A non-empty
            directory rlhf-lit did not write is never replaced.
        max_skipped_updates: stop after this many optimizer steps in a row were skipped for NaN or
            inf gradients (a NaN loss gives NaN gradients); see :mod:`rlhf_lit.stages.nonfinite`.
        revision: Hub revision of ``model`` (and of the tokenizer when ``tokenizer`` is None).
        trust_remote_code: Allow model code from the hub.
        attn_implementation: the attention kernel every model of the stage is loaded with (DPO's
            reference too), passed to ``from_pretrained`` (``eager``, ``sdpa``, ``flash_attention_2``, ...);
            None: transformers' default (:data:`~rlhf_lit.models.loading.AttnImplementation`).
        lora: LoRA adapters (:class:`~rlhf_lit.models.lora.LoRAConfig`); only they train (and a
            reward model's score head). ``lora.export`` chooses merged full weights or the adapter
            alone for the export (the reward model exports merged weights only; DPO's reference is
            then the policy with its adapters disabled).
        gradient_checkpointing: recompute each transformer block's activations of the trained model
            in the backward pass instead of storing them (less activation memory, about one more
            forward pass).
        trainable_layers: train only the top N transformer blocks and what follows them (final
            norm, score head, an untied LM head); embeddings and lower blocks stay frozen and get no
            gradient (:mod:`rlhf_lit.models.freezing`). None trains every weight; refused with ``lora``.
        cache_frozen: keep in memory, per sequence, the output of the frozen part below
            ``trainable_layers`` (:mod:`rlhf_lit.models.trunk_cache`): a sequence read again (a later
            epoch, validation, DPO's reference on the policy's rows) runs only the trainable top.
            Needs ``trainable_layers``; memory is the tokens kept x the hidden size x 4 bytes.
        frozen_modules: modules kept frozen inside what trains, each a module's full name or a dotted
            suffix of it (``layers.29.mlp``: the top block's MLP of a 30-block Llama; ``mlp``: every MLP);
            a name that matches no module is refused, as is the option beside ``lora``
            (:func:`~rlhf_lit.models.freezing.freeze_modules`).
    """

    SAFE_ON_RESUME = StageModule.SAFE_ON_RESUME + ("cache_frozen",)
    """Settings a resume may change: the usual ones, and whether the frozen part's output is kept (the
    same numbers up to float rounding: a row computed alone rather than in its batch)."""

    def __init__(
        self,
        tokenizer: str | None = None,
        missing_pad: MissingPad = "add",
        dtype: DType = "float32",
        export_dir: str | None = None,
        export_existing: ExportExisting = "refuse",
        max_skipped_updates: int = 3,
        revision: str | None = None,
        trust_remote_code: bool = False,
        attn_implementation: AttnImplementation = None,
        lora: LoRAConfig | None = None,
        gradient_checkpointing: bool = False,
        trainable_layers: int | None = None,
        cache_frozen: bool = False,
        frozen_modules: list[str] | None = None,
    ) -> None:
        shared = {name: value for name, value in locals().items() if name not in ("self", "__class__")}
        super().__init__()
        self.lora_config = as_config(LoRAConfig, lora)
        check_trainable_layers(trainable_layers, lora=self.lora_config)
        self.trainable_layers = trainable_layers
        check_frozen_modules(frozen_modules, lora=self.lora_config)
        self.frozen_modules = frozen_modules
        if cache_frozen and trainable_layers is None:
            raise ValueError("cache_frozen keeps the output of the blocks below trainable_layers; set trainable_layers")
        self.trunk_caches = TrunkCaches() if cache_frozen else None
        # the arguments, defaults included, that the subclass's keep_settings keeps (lora as a dict)
        self._shared_settings = {**shared, "lora": None if self.lora_config is None else asdict(self.lora_config)}
        self.tokenizer_name, self.missing_pad = tokenizer, missing_pad
        # every model the stage loads goes through this one object (load_causal_lm, load_reward_model)
        self.loading = ModelLoading(dtype, revision, trust_remote_code, attn_implementation)
        self.gradient_checkpointing = gradient_checkpointing
        self.keep_export(export_dir, export_existing, max_skipped_updates)

    def on_train_batch_start(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        """Report the batch's examples (of every process) to the data module, whose position goes
        into checkpoints: a resumed run, even one stopped mid-epoch, skips exactly what was trained."""
        datamodule = getattr(self.trainer, "datamodule", None)
        if hasattr(datamodule, "mark_consumed"):
            # A ranking batch has N >= 2B rows but B examples (prompts): batch_examples reads B.
            datamodule.mark_consumed(batch_examples(batch) * self.trainer.world_size)

    def load_tokenizer(self, model: str, padding_side: str):
        """The run's tokenizer: ``tokenizer`` when given, else ``model``'s (:func:`stage_tokenizer`)."""
        loading = self.loading
        return stage_tokenizer(
            self.tokenizer_name, model, padding_side, self.missing_pad, loading.revision, loading.trust_remote_code
        )

    def adapted(self, model: torch.nn.Module, kind: str) -> torch.nn.Module:
        """``model`` with the LoRA adapters of ``lora`` (``kind``: ``causal_lm`` or ``reward``), its lower
        layers and ``frozen_modules`` frozen (``trainable_layers``) and gradient checkpointing when asked; the same object
        when none is."""
        model = freeze_lower_layers(with_lora(model, self.lora_config, kind), self.trainable_layers)
        freeze_modules(model, self.frozen_modules)
        if self.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        self.keep_trunk(model)
        return model

    def configure_model(self) -> None:
        """Refuse ``cache_frozen`` under FSDP (a row computed alone would be a collective on one rank),
        then shard as :class:`StageModule` does."""
        if self.trunk_caches is not None and getattr(self, "_device_mesh", None) is not None:
            raise ValueError("cache_frozen is not supported under fsdp / fsdp2: set cache_frozen: false")
        super().configure_model()

    def on_fit_start(self) -> None:
        """The base's checks before any step; then, with ``cache_frozen``, the frozen part's output of every
        training and validation row, computed once in an order of its own (:meth:`prefill_trunk`)."""
        super().on_fit_start()
        if self.trunk_caches is not None:
            self.prefill_trunk()

    def trunk_rows(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(input_ids, attention_mask)`` of the rows the stage's passes read from ``batch``; None: the
        stage does not say, and rows are computed as the passes meet them."""
        return None

    @torch.no_grad()
    def prefill_trunk(self) -> None:
        """Keep the frozen part's output of every row of the data module's training and validation data
        (:meth:`~rlhf_lit.models.trunk_cache.TrunkCaches.prefill`), read from the datasets in index order,
        not through the loaders' samplers: a resumed run, whose sampler skips what was trained, keeps
        the same values. Under the Trainer's precision, as the passes that read them."""
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is None:
            return
        loaders = [datamodule.train_dataloader()]
        if is_overridden("val_dataloader", datamodule):
            loaders.append(datamodule.val_dataloader())
        rows = []
        for loader in (loader for loader in loaders if isinstance(loader, DataLoader)):  # no validation: []
            for batch in dataset_batches(loader):
                found = self.trunk_rows({k: v.to(self.device) for k, v in batch.items() if isinstance(v, torch.Tensor)})
                if found is None:
                    return
                rows.append(found)
        with self.trainer.precision_plugin.forward_context():
            computed = self.trunk_caches.prefill(rows)
        log.info("cache_frozen: kept the frozen blocks' output of %d rows", computed)

    def on_train_epoch_end(self) -> None:
        """Log what the frozen-trunk cache read and computed so far (``trunk_cache/*``)."""
        if self.trunk_caches is not None:
            for name, value in self.trunk_caches.statistics().items():
                self.log(f"trunk_cache/{name}", value)

    def keep_trunk(self, model: torch.nn.Module) -> None:
        """With ``cache_frozen``, keep ``model``'s output below the top ``trainable_layers`` blocks per
        sequence (a frozen copy of the start, DPO's reference, shares the store of the trained model)."""
        if self.trunk_caches is not None:
            blocks = len(transformer_blocks(model))
            self.trunk_caches.attach(model, blocks - self.trainable_layers)

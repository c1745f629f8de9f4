"""What every training stage shares (SFT, reward model, DPO, PPO): :class:`StageModule`.

A stage subclasses :class:`StageModule` and, in its constructor, calls :meth:`StageModule.keep_settings`
(hyperparameters, config dataclasses stored as dicts) and :meth:`StageModule.keep_export` (where the
final model goes, the non-finite guard), loads its tokenizer with :func:`stage_tokenizer` and sets
``self.model`` (or overrides :meth:`StageModule.trained_model`). The base then gives it (a stage fine-tuning one pretrained model
subclasses :class:`~rlhf_lit.stages.pretrained.PretrainedStage`, which adds loading, LoRA, the frozen
lower layers and their cache):

- ``on_fit_start``: the export target checked before any training step, the precision warning,
  then the stage's own :meth:`StageModule.check_before_fit`;
- ``on_fit_end``: the export of :meth:`StageModule.trained_model` (every rank calls it; LoRA
  models merged or as their adapter, :func:`rlhf_lit.models.lora.export_parts`);
- the non-finite guard: an optimizer step with NaN or inf gradients is skipped and counted;
  non-finite weights are never saved;
- checkpoints: the resume check against the checkpoint's settings (all but :attr:`SAFE_ON_RESUME`
  must match, and the Trainer settings of :meth:`StageModule.kept_run_facts`), the frozen models
  (:attr:`FROZEN_PREFIXES`) left out of checkpoints and reloaded from their paths, every other
  weight required on load;
- :meth:`StageModule.release_after_fit`: every stage calls it in ``on_train_end`` to free the
  frozen models (PPO, DPO) and the optimizer states before Lightning's teardown copies them
  to host memory.

:class:`RunLayout` is how a stage declares its place in a run directory (``--run_dir``; the CLI
reads it), and :meth:`StageModule.refusal_before_build` how it refuses a command line before anything
is built (the CLI asks it, with a :class:`TrainerPlan`).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import lightning.pytorch as pl
import torch

from rlhf_lit.models.memory import release_frozen, release_optimizer_states
from rlhf_lit.models.positions import check_sequence_length
from rlhf_lit.models.sharding import shard_models
from rlhf_lit.sources import check_local_source
from rlhf_lit.stages.amp import loss_scale, warn_if_slow_precision
from rlhf_lit.stages.export import ExportExisting, check_export_at_fit_start, export_at_fit_end
from rlhf_lit.stages.nonfinite import NonFiniteGuard, assert_finite
from rlhf_lit.stages.optim import lightning_optimizers
from rlhf_lit.stages.resume import (
    RUN_FACTS,
    check_loaded_keys,
    check_module_resume,
    run_fact_changes,
    run_facts,
    unset_seeds,
)
from rlhf_lit.tokenizer import MissingPad, load_tokenizer

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class RunLayout:
    """How a stage sits in a run directory: its folder name and the earlier exports it reads.

    Args:
        name: the stage's folder, ``<run_dir>/<name>/`` (short, e.g. ``sft``).
        inputs: ``{constructor argument: earlier stage name}``; an argument left unset (None)
            becomes ``<run_dir>/<earlier stage>/model``. The argument must default to None.
        skip_input: ``(argument, init_args) -> bool``: True leaves that input unset for this
            configuration (e.g. PPO's ``reward_model`` when no reward source is the reward model).
    """

    name: str
    inputs: Mapping[str, str] = field(default_factory=dict)
    skip_input: Callable[[str, Mapping[str, Any]], bool] | None = None


class TrainerPlan(NamedTuple):
    """What the CLI knows of the Trainer before anything is built, for :meth:`StageModule.refusal_before_build`:
    ``max_steps`` as given (None or -1: unset) and whether the strategy shards the models (FSDP)."""

    max_steps: int | None
    shards_models: bool


def as_config(cls: type[T], value: T | dict | None) -> T | None:
    """A nested config dataclass from what a stage constructor receives.

    LightningCLI passes the dataclass; ``load_from_checkpoint`` passes back the plain dict stored in
    the hyperparameters (a dataclass there would break ``weights_only`` loading). None stays None
    (an optional group such as ``lora``); anything else is a TypeError.
    """
    if value is None or isinstance(value, cls):
        return value
    if isinstance(value, dict):
        return cls(**value)
    raise TypeError(f"expected {cls.__name__} or a dict of its fields, got {type(value).__name__}")


def stage_tokenizer(
    tokenizer: str | None,
    model: str,
    padding_side: str,
    missing_pad: MissingPad,
    revision: str | None = None,
    trust_remote_code: bool = False,
    model_arg: str = "model",
    tokenizer_arg: str = "tokenizer",
):
    """The stage's tokenizer: ``tokenizer`` when given, else the model's (at the model's ``revision``).

    ``model_arg`` / ``tokenizer_arg`` are the constructor arguments an error names. The model's
    files are checked first (:func:`~rlhf_lit.sources.check_local_source`): a damaged weight file is
    named as the model's, before the tokenizer is loaded from beside it.
    """
    check_local_source(model, model_arg)
    return load_tokenizer(
        tokenizer or model,
        padding_side=padding_side,
        missing_pad=missing_pad,
        revision=revision if tokenizer is None else None,
        trust_remote_code=trust_remote_code,
        what=tokenizer_arg if tokenizer else model_arg,
    )


def require_input(value: str | None, arg: str, what: str) -> str:
    """``value``, or the error for an input left unset (None only so that ``--run_dir`` can supply it)."""
    if value is None:
        raise ValueError(f"{arg} is not set: give {what}, or --run_dir of a run whose SFT stage has finished")
    return value


class StageModule(pl.LightningModule):
    """The base of every stage (see the module docstring for what it provides).

    Every stage takes ``export_dir`` (where the final model and tokenizer are written in Hugging
    Face format at the end of fit; None means ``<log dir or default_root_dir>/model``),
    ``export_existing`` (:data:`~rlhf_lit.stages.export.ExportExisting`: when ``export_dir``
    already holds an earlier rlhf-lit export, ``refuse`` stops before training and ``replace``
    swaps it atomically at the end of fit; a non-empty directory rlhf-lit did not write is never
    replaced) and ``max_skipped_updates`` (stop after this many updates in a row were skipped for
    NaN or inf; see :mod:`rlhf_lit.stages.nonfinite`).

    Class attributes a stage sets: :attr:`EXPORT_WHAT` (words for the export message),
    :attr:`run_layout`, and where they differ from the defaults :attr:`SAFE_ON_RESUME`,
    :attr:`SEED_OPTIONS` and :attr:`FROZEN_PREFIXES`.
    """

    SAFE_ON_RESUME: tuple[str, ...] = ("export_dir", "export_existing", "max_skipped_updates", "attn_implementation")
    """Settings a resume may change: where the export goes, how many skips stop the run, and the attention
    kernel (the same function up to float rounding: a machine without flash-attn resumes a run that used it)."""
    SEED_OPTIONS: tuple[str, ...] = ()
    """The stage's seed options that follow ``seed_everything`` when None (PPO: ``rollout_seed``)."""
    FROZEN_PREFIXES: tuple[str, ...] = ()
    """State-dict prefixes of frozen models: never written to checkpoints, reloaded from their paths."""
    EXPORT_WHAT: str = "model"
    """What the export is, in the message that says where it went (e.g. ``"SFT model"``)."""
    run_layout: RunLayout | None = None
    """The stage's place in a run directory (``--run_dir``); None: it takes no part."""
    released_after_fit: bool = False
    """True once :meth:`release_after_fit` has freed the frozen models and the optimizer states."""

    def keep_settings(self, **configs: Any) -> None:
        """Save the calling constructor's arguments as hyperparameters, with ``configs`` (config
        dataclasses or None, by argument name) stored as plain dicts.

        The settings as given go into checkpoints (under LightningCLI with its class path, so
        ``--ckpt_path`` resumes from the command line); a dataclass there would break
        ``weights_only`` loading, hence the dicts.
        """
        frame = inspect.currentframe().f_back  # the stage's __init__: its arguments are the settings
        shared = getattr(self, "_shared_settings", {})  # PretrainedStage's, defaults included
        self.save_hyperparameters(ignore=[*configs, *shared], frame=frame)
        self.hparams.update(shared)
        self.hparams.update({name: None if cfg is None else asdict(cfg) for name, cfg in configs.items()})

    def keep_export(self, export_dir: str | None, export_existing: ExportExisting, max_skipped_updates: int) -> None:
        """Where the final model goes and how many non-finite updates in a row stop the run."""
        self.export_dir, self.export_existing = export_dir, export_existing
        self.exported_path: Path | None = None
        self.nonfinite = NonFiniteGuard(max_skipped_updates, "max_skipped_updates")

    # ----- what the stage trains and exports -------------------------------------------------------

    def trained_model(self) -> torch.nn.Module:
        """The model whose weights must stay finite (``self.model`` unless a stage says otherwise)."""
        return self.model

    # ----- fit ----------------------------------------------------------------------------------

    def configure_model(self) -> None:
        """Shard the trained model under FSDP (``fsdp`` / ``fsdp2``, :mod:`rlhf_lit.strategies`); no-op otherwise."""
        shard_models(self, {"model": self.trained_model()})

    def configure_optimizers(self) -> dict:
        """AdamW over the trained model with warmup and decay over the whole run
        (``self.optimizer_config``, :class:`~rlhf_lit.stages.optim.OptimizerConfig`)."""
        return lightning_optimizers(
            self.trained_model(), self.optimizer_config, self.trainer.estimated_stepping_batches, self.trainer
        )

    def check_before_fit(self) -> None:
        """A stage's own refusals before any training step (the data module is set up by now)."""

    def longest_row(self) -> tuple[int, str] | None:
        """The most tokens a row of this run holds, and the option that sets it: the data module's
        ``max_length`` (SFT, preference and ranking data); None where the data module has none. Every model
        of the stage must read that many positions (:func:`~rlhf_lit.models.positions.check_sequence_length`)."""
        length = getattr(getattr(self.trainer, "datamodule", None), "max_length", None)
        return (length, "--data.init_args.max_length") if isinstance(length, int) else None

    @classmethod
    def refusal_before_build(cls, init_args: Mapping[str, Any], plan: TrainerPlan) -> str | None:
        """A stage's own refusal of a command line, as one line, or None: the CLI asks it of the stage it
        is about to build, before anything is built (``init_args``: the parsed ``--model.init_args``,
        nested groups as mappings or config objects). The base refuses nothing."""
        return None

    def on_fit_start(self) -> None:
        """Refuse an export target the end of fit could not write, warn about a slow precision, then
        the stage's :meth:`check_before_fit` and rows longer than a model's positions (:meth:`longest_row`):
        all before any training step."""
        check_export_at_fit_start(self.trainer, self.export_dir, self.export_existing)
        warn_if_slow_precision(self.trainer)
        self.check_before_fit()
        row = self.longest_row()
        if row is not None:
            check_sequence_length([self], *row)

    def on_fit_end(self) -> None:
        """Export :meth:`trained_model` and the tokenizer in Hugging Face format (rank 0 writes), after
        taking off the frozen-trunk cache's hooks (``cache_frozen``) and freeing what it kept."""
        caches = getattr(self, "trunk_caches", None)
        if caches is not None:
            caches.remove()
        self.exported_path = export_at_fit_end(
            self.trainer,
            self.trained_model(),
            self.tokenizer,
            self.export_dir,
            self.EXPORT_WHAT,
            self.export_existing,
            facts=self.export_facts(),
        )

    def export_facts(self) -> dict[str, Any]:
        """More entries of the export's marker (:func:`~rlhf_lit.stages.export.save_pretrained_atomically`):
        none by default; a policy trained on its own samples records how it sampled."""
        return {}

    def release_after_fit(self) -> None:
        """Free the frozen models (:attr:`FROZEN_PREFIXES`) and the optimizer states: nothing reads them
        after training, yet Lightning's teardown (``Strategy.teardown``, which runs before ``on_fit_end``)
        would copy them to host memory (PPO on a GPU: four models and two optimizers' moments, where a
        user reads the policy and the critic).

        Call it in ``on_train_end``: after the callbacks' ``on_train_end`` (``last.ckpt`` is written
        there, optimizer states included) and before the teardown and the export. On every rank; no
        collective. A released frozen model keeps its structure on the meta device and raises
        :class:`~rlhf_lit.models.memory.ReleasedError` when called, so ``trainer.validate`` or another
        ``fit`` of this module needs a fresh module (``load_from_checkpoint``). A checkpoint saved
        afterwards holds no optimizer states (:meth:`drop_released`).
        """
        for prefix in self.FROZEN_PREFIXES:
            release_frozen(self, prefix.rstrip("."))
        release_optimizer_states(self.trainer.optimizers)
        self.released_after_fit = True

    def on_train_end(self) -> None:
        """Free what nobody reads after training before Lightning's teardown copies it to host memory
        (:meth:`release_after_fit`: the frozen models and the optimizer states; the trained model stays).
        A stage with its own end-of-training work does it first and then calls this."""
        self.release_after_fit()

    def on_before_backward(self, loss: torch.Tensor) -> None:
        """Under fp16, note whether the loss is finite: a step the GradScaler skips counts as
        non-finite when its loss was not (:mod:`rlhf_lit.stages.nonfinite`)."""
        if loss_scale(self.trainer) is not None:  # a GradScaler
            self.nonfinite.note_loss(loss)

    def on_before_optimizer_step(self, optimizer) -> None:
        """Drop non-finite gradients (the step then changes nothing) and count the skip; under fp16
        count the steps the GradScaler skips (Lightning has unscaled the gradients by now)."""
        self.nonfinite.check_optimizer(
            optimizer, "the optimizer", f"step {self.global_step}", loss_scale(self.trainer), self.any_rank
        )

    def any_rank(self, flag: bool) -> bool:
        """``flag`` OR-ed over the processes (a collective under ddp / fsdp: every rank must call it)."""
        return self.trainer.strategy.reduce_boolean_decision(flag, all=False)

    # ----- checkpoints ----------------------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Refuse to save non-finite weights; keep the skip counters and the run's Trainer settings and
        seed (:func:`~rlhf_lit.stages.resume.run_facts`); leave the frozen models out."""
        assert_finite(self.trained_model(), type(self).__name__)
        checkpoint["nonfinite"] = self.nonfinite.state_dict()
        checkpoint[RUN_FACTS] = run_facts(self.trainer)
        self.drop_frozen(checkpoint)
        self.drop_released(checkpoint)

    def kept_run_facts(self) -> list[str]:
        """The :func:`~rlhf_lit.stages.resume.run_facts` a resume must keep.

        Precision, gradient accumulation and the number of processes change what every step
        computes. ``max_steps`` and ``max_epochs`` set a decaying schedule's length
        (``estimated_stepping_batches``): a resume rebuilds the schedule with the new length, so
        the LR would jump; with ``schedule: constant`` they only say how far the run goes.
        """
        kept = ["trainer.precision", "trainer.accumulate_grad_batches", "trainer.world_size"]
        if self.optimizer_config.schedule != "constant":
            kept += ["trainer.max_steps", "trainer.max_epochs"]
        return kept

    def run_changes(self, checkpoint: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
        """The differences from the checkpoint's Trainer settings and run seed that a resume refuses
        (:meth:`kept_run_facts`; the run seed when a seed option follows it); {} unless resuming a fit."""
        if self._trainer is None or getattr(self._trainer.state, "fn", None) != "fit":
            return {}
        return run_fact_changes(
            checkpoint.get(RUN_FACTS, {}),
            run_facts(self.trainer),
            self.kept_run_facts(),
            unset_seeds(self, self.SEED_OPTIONS),
        )

    def drop_frozen(self, checkpoint: dict) -> None:
        """Remove the :attr:`FROZEN_PREFIXES` weights from ``checkpoint`` (reloaded from paths on resume)."""
        if self.FROZEN_PREFIXES:
            state = checkpoint["state_dict"]  # {} on ranks > 0 under FSDP (gathered on rank 0)
            checkpoint["state_dict"] = {k: v for k, v in state.items() if not k.startswith(self.FROZEN_PREFIXES)}

    def drop_released(self, checkpoint: dict) -> None:
        """After :meth:`release_after_fit`, leave the emptied optimizer states out of ``checkpoint``: it
        is then a weights-only checkpoint (as Lightning's ``weights_only=True`` writes), which
        ``load_from_checkpoint`` reads and a resume refuses, rather than one that resumes with Adam's
        moments silently reset."""
        if self.released_after_fit:
            checkpoint.pop("optimizer_states", None)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Check the configuration, Trainer settings and run seed against the checkpoint's; restore the
        skip counters."""
        check_module_resume(self, checkpoint, self.SAFE_ON_RESUME, self.run_changes(checkpoint))
        if "nonfinite" in checkpoint:
            self.nonfinite.load_state_dict(checkpoint["nonfinite"])

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Load weights; the frozen models (:attr:`FROZEN_PREFIXES`) may be missing: they were reloaded
        from their paths. Any other missing or unknown weight is refused when ``strict``."""
        if not self.FROZEN_PREFIXES:
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        result = super().load_state_dict(state_dict, strict=False, assign=assign)
        check_loaded_keys(result.missing_keys, result.unexpected_keys, self.FROZEN_PREFIXES, strict)
        return result

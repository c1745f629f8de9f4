"""Resuming a run: the configuration given now against the one the checkpoint was written with.

A resume continues the optimizer states, the data position and (for PPO) the KL controller of the
checkpoint. A different model path silently becomes a different reference (PPO's KL jumped from
1.9 to 9.9 in one such resume), a different batch size or data file changes what the data
position means, a different learning rate never takes effect (the scheduler restores its own): such
differences are refused, all listed in one message. Differences that only change how far the run
goes or where its outputs go (the stage lists them, e.g. ``max_rollouts``, ``export_dir``) are
applied and logged.

Beside the hyperparameters a checkpoint records :func:`run_facts` (under :data:`RUN_FACTS`): the
Trainer settings that change what every step computes (precision, gradient accumulation, the
number of processes), the run's length (a decaying schedule is rebuilt with the new length on
resume) and the run seed that unset seed options follow (:mod:`rlhf_lit.run_seed`). A stage names
the ones that must match (:func:`run_fact_changes`); a checkpoint written before they were recorded
is not checked for them.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Collection, Mapping
from dataclasses import asdict, is_dataclass
from typing import Any

from rlhf_lit.run_seed import run_seed

log = logging.getLogger(__name__)

INTERNAL_KEYS = ("_class_path", "_instantiator")
"""Keys LightningCLI adds to the hyperparameters; not settings."""
SAFE_DATA_KEYS = frozenset({"num_workers"})
"""Data-module settings that may change on resume (everything else moves the data position)."""


RUN_FACTS = "run_facts"
"""The checkpoint key of :func:`run_facts`."""
RUN_SEED = "seed_everything"
"""The run seed's name among :func:`run_facts`."""


class ResumeMismatch(ValueError):
    """The configuration differs from the checkpoint's where continuing would break the run."""


def _flatten(settings: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if key in INTERNAL_KEYS:
            continue
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        elif isinstance(value, tuple):
            flat[f"{prefix}{key}"] = list(value)
        elif isinstance(value, str) and ("/" in value or "\\" in value):
            flat[f"{prefix}{key}"] = os.path.normpath(value)  # "dir/" and "./dir" are "dir"
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def differences(
    saved: Mapping[str, Any], current: Mapping[str, Any], prefix: str, defaults: Mapping[str, Any] | None = None
) -> dict[str, tuple[Any, Any]]:
    """``{"<prefix><key>": (checkpoint value, current value)}`` for every leaf setting that differs.

    A setting the checkpoint does not record (it was written before the setting existed) counts as
    unchanged while its current value is its default in ``defaults`` (nested settings flattened as
    here): an older checkpoint resumes, unless the new setting is turned on.
    """
    old, new = _flatten(saved), _flatten(current)
    known = _flatten(defaults or {})
    missing = object()
    return {
        f"{prefix}{key}": (old.get(key, missing), new.get(key, missing))
        for key in sorted(old.keys() | new.keys())
        if old.get(key, missing) != new.get(key, missing)
        and not (key not in old and key in known and new.get(key, missing) == known[key])
    }


def init_defaults(cls: type) -> dict[str, Any]:
    """The default of every ``__init__`` argument of ``cls`` and of the classes it passes ``**kwargs`` on to
    (a stage's ``**stage_args`` reach :class:`~rlhf_lit.stages.base.PretrainedStage`), config dataclasses as
    dicts (as :meth:`~rlhf_lit.stages.base.StageModule.keep_settings` records them): a setting added after a
    checkpoint was written is compared at its default."""
    defaults = {}
    for klass in reversed(cls.__mro__):  # the subclass's own default wins
        if "__init__" not in vars(klass):
            continue
        for name, parameter in inspect.signature(klass.__init__).parameters.items():
            if parameter.default is inspect.Parameter.empty:
                continue
            value = parameter.default
            defaults[name] = asdict(value) if is_dataclass(value) and not isinstance(value, type) else value
    return defaults


def check_module_resume(
    module: Any,
    checkpoint: Mapping[str, Any],
    safe_model_keys: Collection[str],
    extra: Mapping[str, tuple[Any, Any]] | None = None,
) -> None:
    """:func:`check_resume` for a LightningModule resuming a fit (its trainer's data module too).

    Only a resumed ``fit`` is checked: ``load_from_checkpoint`` with overrides, or validating a
    checkpoint on other data, continues nothing. A checkpoint without optimizer states cannot be
    resumed (:meth:`rlhf_lit.stages.base.StageModule.drop_released`).
    """
    trainer = getattr(module, "_trainer", None)
    if trainer is None or getattr(trainer.state, "fn", None) != "fit":
        return
    if "optimizer_states" not in checkpoint:  # before Lightning's KeyError, which names save_weights_only only
        raise ResumeMismatch(
            "cannot resume: the checkpoint holds no optimizer states (written with weights_only, or saved after "
            "fit ended, when rlhf-lit had released them); resume from a checkpoint written during fit (last.ckpt), "
            "or load its weights with load_from_checkpoint and start a new run"
        )
    check_same_stage(checkpoint, type(module))
    data_hparams = getattr(getattr(trainer, "datamodule", None), "hparams", None)
    check_resume(checkpoint, module.hparams, data_hparams, safe_model_keys, extra, init_defaults(type(module)))


def check_same_stage(checkpoint: Mapping[str, Any], stage: type) -> None:
    """Refuse a checkpoint another stage wrote (its ``_class_path``, as LightningCLI records it): the settings of
    two stages differ in every name, so :func:`check_resume` would list them all without saying why."""
    from rlhf_lit.callable_specs import import_class  # deferred: a stage module imports this one

    class_path = checkpoint.get("hyper_parameters", {}).get("_class_path")
    written = import_class(class_path) if isinstance(class_path, str) else None
    if written is None or issubclass(stage, written) or issubclass(written, stage):
        return  # written in Python, or by a class that cannot be imported here: check_resume compares the settings
    raise ResumeMismatch(
        f"cannot resume: the checkpoint is of a {written.__name__} run ({class_path}) and this run fits "
        f"{stage.__name__}; give --ckpt_path a checkpoint of a {stage.__name__} run, or start without --ckpt_path"
    )


def _describe(value: Any) -> str:
    return "(not set)" if type(value) is object else repr(value)


def _canonical(data_hparams: Mapping[str, Any]) -> Mapping[str, Any]:
    """Data hyperparameters as the resume check compares them: ``hh_render`` in its canonical spelling
    (a checkpoint may record ``chat_template`` for ``always``: the deprecated alias, read here through
    :func:`~rlhf_lit.tokenizer.template_choice` until it is removed in 0.3.0), and a checkpoint's
    ``apply_chat_template`` (deprecated, removed in 0.3.0) as the ``chat_template`` it means."""
    from rlhf_lit.tokenizer import APPLY_CHAT_TEMPLATE, template_choice  # deferred: importing it loads transformers

    hparams = dict(data_hparams)
    if isinstance(hparams.get("hh_render"), str):
        hparams["hh_render"] = template_choice(hparams["hh_render"], "data.hh_render")
    if "apply_chat_template" in hparams:
        hparams["chat_template"] = APPLY_CHAT_TEMPLATE[bool(hparams.pop("apply_chat_template"))]
    return hparams


def check_resume(
    checkpoint: Mapping[str, Any],
    model_hparams: Mapping[str, Any],
    datamodule_hparams: Mapping[str, Any] | None,
    safe_model_keys: Collection[str],
    extra: Mapping[str, tuple[Any, Any]] | None = None,
    model_defaults: Mapping[str, Any] | None = None,
) -> None:
    """Refuse a resume whose settings differ from the checkpoint's in a way that breaks it.

    Args:
        checkpoint: the loaded checkpoint (``hyper_parameters``, ``datamodule_hyper_parameters``).
        model_hparams: the stage's hyperparameters now.
        datamodule_hparams: the data module's now (None: not known, e.g. ``load_from_checkpoint``).
        safe_model_keys: the stage's settings that may change (top-level names; nested ones too).
        extra: more ``{name: (checkpoint value, current value)}`` facts that must match (e.g. the
            number of processes).
        model_defaults: the stage's settings' defaults (:func:`init_defaults`): a setting newer than
            the checkpoint, left at its default, is no change.

    Raises:
        ResumeMismatch: listing every unsafe difference, one per line.
    """
    changed = differences(checkpoint.get("hyper_parameters", {}), model_hparams, "model.", model_defaults)
    if datamodule_hparams is not None and "datamodule_hyper_parameters" in checkpoint:
        changed.update(
            differences(_canonical(checkpoint["datamodule_hyper_parameters"]), _canonical(datamodule_hparams), "data.")
        )
    changed.update({k: v for k, v in (extra or {}).items() if v[0] != v[1]})

    def is_safe(key: str) -> bool:
        section, _, name = key.partition(".")
        top = name.split(".")[0]
        return (section == "model" and top in safe_model_keys) or (section == "data" and top in SAFE_DATA_KEYS)

    unsafe = {k: v for k, v in changed.items() if not is_safe(k)}
    for key, (old, new) in changed.items():
        if key not in unsafe:
            log.info("resuming with %s changed: %s -> %s", key, _describe(old), _describe(new))
    if unsafe:
        lines = "\n".join(
            f"  {k}: checkpoint {_describe(old)}, now {_describe(new)}" for k, (old, new) in unsafe.items()
        )
        raise ResumeMismatch(
            "cannot resume: the configuration differs from the checkpoint's where continuing would break "
            f"the run:\n{lines}\nresume with the checkpoint's settings (only {', '.join(sorted(safe_model_keys))} "
            "may change), or start a new run without --ckpt_path"
        )


def run_facts(trainer: Any) -> dict[str, Any]:
    """What a checkpoint records of the run beside the hyperparameters (see the module docstring).

    ``trainer.world_size`` is ``devices x num_nodes``; the precision is Lightning's normalised name
    (``32`` and ``32-true`` are one). ``seed_everything`` is None when the run was not seeded.
    """
    return {
        "trainer.precision": str(trainer.precision),
        "trainer.accumulate_grad_batches": int(trainer.accumulate_grad_batches),
        "trainer.world_size": int(trainer.world_size),
        "trainer.max_steps": int(trainer.max_steps),
        "trainer.max_epochs": trainer.max_epochs,
        RUN_SEED: run_seed(),
    }


def unset_seeds(module: Any, seed_options: Collection[str]) -> list[str]:
    """The seed options left at None, which follow the run seed: the stage's (``seed_options``, e.g.
    PPO's ``rollout_seed``) as ``model.<name>``, and its data module's ``seed`` as ``data.seed``."""
    unset = [f"model.{name}" for name in seed_options if name in module.hparams and module.hparams[name] is None]
    trainer = getattr(module, "_trainer", None)
    data_hparams = getattr(getattr(trainer, "datamodule", None), "hparams", {})
    if "seed" in data_hparams and data_hparams["seed"] is None:
        unset.append("data.seed")
    return unset


def run_fact_changes(
    saved: Mapping[str, Any], now: Mapping[str, Any], kept: Collection[str], seeds_following: Collection[str]
) -> dict[str, tuple[Any, Any]]:
    """``{name: (checkpoint value, current value)}`` of the :func:`run_facts` a resume must keep that differ.

    Args:
        saved: the checkpoint's facts (``{}`` for a checkpoint written before they were recorded).
        now: this run's.
        kept: the names that must match (the stage's choice).
        seeds_following: the seed options left unset (e.g. ``data.seed``): when there are any the run
            seed must match too, and its name in the message says which options follow it.

    Other differences are allowed, and logged.
    """
    compared = {name: name for name in kept}
    if seeds_following:
        verb = "follow" if len(seeds_following) > 1 else "follows"
        compared[RUN_SEED] = f"{RUN_SEED} ({' and '.join(seeds_following)} {verb} it)"
    changed = {}
    for name in saved.keys() & now.keys():
        if saved[name] == now[name]:
            continue
        if name in compared:
            changed[compared[name]] = (saved[name], now[name])
        else:
            log.info("resuming with %s changed: %s -> %s", name, _describe(saved[name]), _describe(now[name]))
    return dict(sorted(changed.items()))


def check_loaded_keys(
    missing: Collection[str], unexpected: Collection[str], frozen_prefixes: tuple[str, ...], strict: bool
) -> None:
    """Refuse a checkpoint that lacks trained weights or holds unknown ones.

    A stage leaves the frozen models it reloads from their paths (``frozen_prefixes``, e.g. PPO's
    reference and reward model) out of its checkpoints; every other weight must be there.

    Raises:
        RuntimeError: when ``strict`` and a trained weight is missing or an unknown one present.
    """
    missing = [key for key in missing if not key.startswith(frozen_prefixes)]
    if strict and (missing or unexpected):
        parts = [
            f"{what} {len(keys)} weights ({', '.join(sorted(keys)[:5])}{', ...' if len(keys) > 5 else ''})"
            for what, keys in (("missing", missing), ("unexpected", list(unexpected)))
            if keys
        ]
        raise RuntimeError("the checkpoint does not fit the model: " + "; ".join(parts))

"""One directory per experiment: ``--run_dir DIR`` places a stage's outputs under DIR and chains the stages.

    rlhf-lit fit --config configs/offline/sft.yaml --run_dir runs/exp1
    rlhf-lit fit --config configs/offline/reward_model.yaml  --run_dir runs/exp1   # model: runs/exp1/sft/model
    rlhf-lit fit --config configs/offline/ppo.yaml --run_dir runs/exp1   # sft_model, reward_model from the run

Layout, with ``<stage>`` the stage's :attr:`RunLayout.name` (``sft``, ``reward_model``, ``ppo``)::

    DIR/<stage>/version_N/              TensorBoard events and config.yaml (the resolved config)
    DIR/<stage>/version_N/checkpoints/  Lightning checkpoints (last.ckpt ...)
    DIR/<stage>/model/                  the stage's export, which later stages read

Rules (rlhf-lit never silently rewrites a setting):

- Only settings left unset are filled: the stage's ``export_dir`` (None), the logger when it is
  rlhf-lit's default one (its ``save_dir`` and ``name`` as the default has them; a value equal to
  the default cannot be told from the default), ``trainer.default_root_dir`` when it is the default.
- An output set explicitly elsewhere is refused with one message: an ``export_dir`` other than
  ``DIR/<stage>/model`` (the place the next stage reads), a logger ``save_dir`` or a checkpoint
  callback's ``dirpath`` outside DIR, a ``default_root_dir`` outside DIR.
- Inputs (a stage's :attr:`RunLayout.inputs`, e.g. PPO's ``sft_model``) left unset default to the
  previous stage's export in DIR, which must exist; one given explicitly is used as given.
- A fresh ``fit`` (no ``--ckpt_path``) whose export is already in DIR stops before any model is
  loaded (unless ``export_existing: replace``); a new experiment is a new DIR.
- ``--ckpt_path`` inside ``DIR/<stage>/version_N/`` resumes logging into that same ``version_N``.
- One ``fit`` of a stage in DIR at a time: a second one refuses, naming the first
  (:mod:`rlhf_lit.cli.run_lock`, taken by the CLI after the config is filled).

A stage takes part by declaring ``run_layout = RunLayout("<name>", inputs={...})``
(:class:`rlhf_lit.stages.base.RunLayout`): one line.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import Any

from rlhf_lit.artifacts import EXPORT_MARKER
from rlhf_lit.callable_specs import import_class
from rlhf_lit.sources import MissingSource, producing_config
from rlhf_lit.stages.base import RunLayout
from rlhf_lit.stages.export import check_export_target

log = logging.getLogger(__name__)

RUN_DIR_KEY = "run_dir"
"""The top-level config key (``--run_dir``)."""
EXPORT_NAME = "model"
"""A stage's export is ``<run_dir>/<stage>/model``."""
RUN_DIR_HELP = (
    "One directory for a whole experiment: this stage's logs, checkpoints, resolved config and export go "
    "to RUN_DIR/<stage>/ (sft, reward_model, ppo, ...), and the stage's unset inputs (the RM's model, PPO's sft_model "
    "and reward_model) default to the earlier stages' exports there. Settings given explicitly are kept; "
    "an output placed outside RUN_DIR is refused."
)


class RunDirError(ValueError):
    """A setting that contradicts ``--run_dir``, or an earlier stage's export missing from it."""


def add_run_dir_argument(parser) -> None:
    """Add ``--run_dir`` (top-level key ``run_dir``) to a subcommand's parser."""
    parser.add_argument(f"--{RUN_DIR_KEY}", type=str | None, default=None, help=RUN_DIR_HELP)


def stage_title(stage: str) -> str:
    """How messages name a stage: a short name as the acronym it is (``SFT``, ``PPO``, ``DPO``), a
    longer one in words (``reward_model`` -> ``reward model``)."""
    return stage.upper() if len(stage) <= 3 else stage.replace("_", " ")


def stage_dir(run_dir: str, stage: str) -> str:
    """``<run_dir>/<stage>``: where everything of one stage goes."""
    return os.path.join(run_dir, stage)


def stage_export(run_dir: str, stage: str) -> str:
    """``<run_dir>/<stage>/model``: the stage's export, read by later stages."""
    return os.path.join(run_dir, stage, EXPORT_NAME)


def _absolute(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([_absolute(path), _absolute(root)]) == _absolute(root)


def _class_name(class_path: str) -> str:
    return class_path.rsplit(".", 1)[-1]


def stage_layout(class_path: str) -> RunLayout:
    """The :class:`RunLayout` the stage class at ``class_path`` declares (``run_layout``)."""
    layout = getattr(import_class(class_path), "run_layout", None)
    if not isinstance(layout, RunLayout):
        raise RunDirError(
            f"--run_dir: {_class_name(class_path)} declares no run_layout (rlhf_lit.stages.base.RunLayout), so it has "
            "no place in a run directory; drop --run_dir and set its outputs (logger, export_dir) yourself"
        )
    return layout


def _place_logger(cfg, run_dir: str, stage: str, default_logger: Mapping[str, Any]) -> bool:
    """Put rlhf-lit's default logger at ``<run_dir>/<stage>``; refuse other loggers writing outside.

    Returns whether the default logger was placed (only that one follows a resumed checkpoint).
    """
    trainer = cfg["trainer"]
    logger = trainer.get("logger")
    loggers = logger if isinstance(logger, list) else [logger]
    default_args = default_logger.get("init_args", {})
    placed = False
    for entry in loggers:
        if entry is None or isinstance(entry, bool):
            continue  # True: Lightning's default under default_root_dir (placed below); False: none
        init_args = entry.get("init_args")
        if init_args is None or "save_dir" not in init_args:
            continue  # a logger without a local directory (a remote service)
        is_default = entry.get("class_path") == default_logger.get("class_path") and all(
            init_args.get(key) == default_args.get(key) for key in ("save_dir", "name")
        )
        if is_default:
            init_args["save_dir"], init_args["name"] = run_dir, stage
            placed = True
        elif init_args.get("save_dir") is None:
            init_args["save_dir"] = run_dir  # unset: filled, not rewritten
        elif not _inside(str(init_args["save_dir"]), run_dir):
            raise RunDirError(
                f"--run_dir {run_dir}: trainer.logger ({_class_name(str(entry.get('class_path')))}) writes to "
                f"save_dir {init_args['save_dir']}, outside the run directory; give it a save_dir under {run_dir}, "
                f"or drop the logger (then --run_dir logs to TensorBoard in {stage_dir(run_dir, stage)})"
            )
    return placed


def _place_root_dir(cfg, run_dir: str, stage: str, default_root_dir: str | None) -> None:
    """``trainer.default_root_dir`` (checkpoints when there is no logger): ``<run_dir>/<stage>``."""
    trainer = cfg["trainer"]
    root = trainer.get("default_root_dir")
    if root is None or (default_root_dir is not None and root == default_root_dir):
        trainer["default_root_dir"] = stage_dir(run_dir, stage)
    elif not _inside(str(root), run_dir):
        raise RunDirError(
            f"--run_dir {run_dir}: trainer.default_root_dir {root} is outside the run directory; "
            f"leave it unset (it becomes {stage_dir(run_dir, stage)}) or put it under {run_dir}"
        )


def _check_callbacks(cfg, run_dir: str) -> None:
    """Refuse a callback (a checkpoint callback's ``dirpath``) that writes outside the run directory."""
    for callback in cfg["trainer"].get("callbacks") or []:
        init_args = callback.get("init_args") if hasattr(callback, "get") else None
        dirpath = init_args.get("dirpath") if init_args is not None else None
        if dirpath is not None and not _inside(str(dirpath), run_dir):
            raise RunDirError(
                f"--run_dir {run_dir}: {_class_name(str(callback.get('class_path')))} writes checkpoints to "
                f"dirpath {dirpath}, outside the run directory; leave dirpath unset (checkpoints then go to "
                f"the run's version_N/checkpoints) or put it under {run_dir}"
            )


def _place_export(init_args, run_dir: str, stage: str) -> str | None:
    """Set an unset ``export_dir`` to ``<run_dir>/<stage>/model``; refuse another one."""
    if "export_dir" not in init_args:
        return None
    target = stage_export(run_dir, stage)
    given = init_args.get("export_dir")
    if given is None:
        init_args["export_dir"] = target
    elif _absolute(str(given)) != _absolute(target):
        raise RunDirError(
            f"--run_dir {run_dir} puts the {stage_title(stage)} export at {target} (where later stages look for it), but "
            f"model.init_args.export_dir is {given}; drop export_dir (or --model.init_args.export_dir null), "
            "or drop --run_dir"
        )
    return target


def _fill_inputs(init_args, layout: RunLayout, run_dir: str) -> None:
    """Unset inputs: the earlier stages' exports in the run directory, which must exist."""
    for arg, source in layout.inputs.items():
        if init_args.get(arg) is not None:
            log.info("%s: %s (given; not the run's %s export)", arg, init_args[arg], source)
            continue
        if layout.skip_input is not None and layout.skip_input(arg, init_args):
            continue
        path = stage_export(run_dir, source)
        if not os.path.isdir(path):
            raise RunDirError(
                f"{path} not found: run the {stage_title(source)} stage with --run_dir {run_dir} first "
                f"(model.init_args.{arg} defaults to it; set --model.init_args.{arg} to use another model)"
            )
        init_args[arg] = path
        log.info("%s: %s (the %s export of --run_dir %s)", arg, path, source, run_dir)


def _resume_version(logger_cfg, ckpt_path: str, run_dir: str, stage: str) -> None:
    """A checkpoint under ``<run_dir>/<stage>/<version>/`` continues logging in that ``<version>``."""
    root = stage_dir(run_dir, stage)
    if not _inside(ckpt_path, root):
        return
    parts = os.path.relpath(os.path.abspath(ckpt_path), os.path.abspath(root)).split(os.sep)
    if len(parts) < 2 or parts[0] == EXPORT_NAME:
        return
    entries = logger_cfg if isinstance(logger_cfg, list) else [logger_cfg]
    for entry in entries:
        init_args = entry.get("init_args") if hasattr(entry, "get") else None
        if init_args is not None and "version" in init_args and init_args.get("version") is None:
            init_args["version"] = parts[0]


def _refuse_finished_stage(init_args, target: str | None, run_dir: str, stage: str) -> None:
    """Stop a fresh fit whose export would be refused at its end, before any model is loaded."""
    if target is None:
        return
    try:
        check_export_target(target, init_args.get("export_existing", "refuse"))
    except ValueError as error:
        if os.path.isfile(os.path.join(target, EXPORT_MARKER)):  # this stage has finished in this run directory
            raise RunDirError(
                f"--run_dir {run_dir}: the {stage_title(stage)} stage has run there already (its export {target} "
                f"exists); for a new experiment give another --run_dir, to continue this one resume with "
                f"--ckpt_path {stage_dir(run_dir, stage)}/version_N/checkpoints/last.ckpt, to train it again in "
                "place set --model.init_args.export_existing replace"
            ) from None
        raise RunDirError(f"--run_dir {run_dir}: {error}") from None


def apply_run_dir(cfg, trainer_defaults: Mapping[str, Any], subcommand: str | None) -> None:
    """Fill one subcommand's parsed config from its ``run_dir`` (module docstring); no-op without one.

    Args:
        cfg: the subcommand's config (a jsonargparse Namespace: ``run_dir``, ``trainer``, ``model``,
            ``ckpt_path``), changed in place before the classes are instantiated.
        trainer_defaults: the CLI's trainer defaults: its ``logger`` (``class_path`` and ``init_args``)
            and ``default_root_dir`` are recognised as unset.
        subcommand: ``fit`` checks that the stage has not run there already (unless resuming).

    Raises:
        RunDirError: a setting that contradicts the run directory, or a missing earlier export.
    """
    run_dir = cfg.get(RUN_DIR_KEY)
    if not run_dir:
        return
    model = cfg["model"]
    layout = stage_layout(str(model["class_path"]))
    init_args = model["init_args"]
    stage = layout.name
    default_logger = trainer_defaults.get("logger")
    placed_logger = _place_logger(cfg, run_dir, stage, default_logger if isinstance(default_logger, Mapping) else {})
    _place_root_dir(cfg, run_dir, stage, trainer_defaults.get("default_root_dir"))
    _check_callbacks(cfg, run_dir)
    target = _place_export(init_args, run_dir, stage)
    ckpt_path = cfg.get("ckpt_path")
    if ckpt_path and placed_logger:
        _resume_version(cfg["trainer"]["logger"], str(ckpt_path), run_dir, stage)
    if subcommand == "fit" and not ckpt_path:
        _refuse_finished_stage(init_args, target, run_dir, stage)
    _fill_inputs(init_args, layout, run_dir)
    log.info("run dir %s: the %s stage writes to %s", run_dir, stage, stage_dir(run_dir, stage))


def run_dir_export(text: str) -> str | None:
    """``<run_dir>/<stage>/model`` of a config text that sets ``run_dir`` (None for any other config)."""
    run_dir = re.search(r"^run_dir:\s*(\S+)\s*$", text, flags=re.MULTILINE)
    stage_class = re.search(r"^model:\s*\n\s+class_path:\s*(\S+)", text, flags=re.MULTILINE)
    if not run_dir or not stage_class:
        return None
    try:
        layout = stage_layout(stage_class.group(1))
    except RunDirError:  # a class that does not import, or declares no run_layout
        return None
    return stage_export(run_dir.group(1).strip("'\""), layout.name)


def with_run_dir_hint(error: BaseException) -> BaseException:
    """A :class:`~rlhf_lit.sources.MissingSource` that names no config, again with the configs that set
    ``run_dir`` searched too (:func:`~rlhf_lit.sources.producing_config`); any other error as it is.

    :mod:`rlhf_lit.sources` sits below the stages and cannot tell where a stage exports in a run
    directory; the CLI, which knows the stages, completes the hint when it reports the error.
    """
    if not isinstance(error, MissingSource) or error.config is not None:
        return error
    config = producing_config(error.name_or_path, run_dir_export)
    return error if config is None else MissingSource(error.what, error.name_or_path, config)

"""The `rlhf-lit` command: LightningCLI with the stage and data classes chosen by `class_path`.

    rlhf-lit fit --config configs/sft.yaml
    rlhf-lit fit --config configs/ppo.yaml --trainer.strategy ddp --trainer.devices 2
    rlhf-lit fit --config configs/reward_model.yaml --print_config
    rlhf-lit fit --config configs/ppo.yaml --ckpt_path logs/.../last.ckpt      # resume

Stages never import data modules; this file wires them: the stage loads the tokenizer (with its
pad policy) and the data module receives that very object, so a run has one tokenizer.

Errors a user can fix (a bad option, a missing file or model, bad data, a resume that does not
match its checkpoint) end with one line ``rlhf-lit: error: ...`` and exit status 2 (options) or 1
(everything else); ``--debug`` (or ``RLHF_LIT_DEBUG=1``) shows the traceback instead. An option
or config mistake names the key as it can be typed, where it was given (the option, or the config
file and line: :mod:`rlhf_lit.cli.option_sources`) and the nearest valid key or class
(:mod:`rlhf_lit.cli.parser_errors`, :mod:`rlhf_lit.cli.option_names`). rlhf-lit's own log messages
(counts of skipped, dropped and truncated records, pad policies, exports) are printed to stderr as
``[rlhf-lit] ...``.

What the command offers beyond LightningCLI's defaults:

- ``--model`` / ``--data`` take the short class names (``--model PPOModule --data PromptDataModule``)
  and ``--help`` lists them: every stage and data module is imported before the parser is built,
  so jsonargparse knows the subclasses (a new stage listed in ``rlhf_lit.stages`` appears by itself).
- No ``--optimizer`` / ``--lr_scheduler``: each stage builds its own optimizers and schedule (from its
  ``optimizer`` option); LightningCLI's would crash PPO or silently replace AdamW.
- A stage refuses a command line before anything is built and before the other processes start
  (:func:`stage_refusal` asks its ``refusal_before_build``): PPO refuses ``--trainer.max_steps``, which
  counts optimizer steps there (epochs x minibatches per rollout; ``--model.init_args.max_rollouts``
  sets the run's length), and ``sampling.decode compiled`` or ``ppo.forward compiled`` under ``fsdp`` / ``fsdp2``.
- The progress bar is :class:`~rlhf_lit.callbacks.RunProgressBar` (rollouts out of
  ``max_rollouts``, or steps out of the real total) unless the config disables the bar or lists its own.
- Every value a config file can hold can be typed as an option (``--model.init_args.reward.missing_eos_penalty
  null``, lists and mappings too), and a YAML syntax error names its file, line and column, as does a
  config file that is not UTF-8, holds no mapping or writes a key twice, and a group of options given a
  number or a list (:mod:`rlhf_lit.cli.jsonargparse_fixes`, :mod:`rlhf_lit.cli.config_checks`).
- ``--ckpt_path`` is checked before anything is built: a missing or damaged checkpoint is one line,
  and a damaged ``last.ckpt`` names the intact checkpoint to resume from (:mod:`rlhf_lit.cli.resume_check`;
  ``--ckpt_path last`` / ``best``, which Lightning resolves in fit, are checked where they are loaded);
  with ``--run_dir`` a second ``fit`` of the same stage refuses while the first runs (:mod:`rlhf_lit.cli.run_lock`).
- Every fit stops cleanly on SIGTERM / SIGUSR1 (:class:`~rlhf_lit.callbacks.Preemption`): at the end
  of the current step or rollout, with ``last.ckpt`` written and the resume command logged, exit
  status ``128 + signal``.
- Expected, harmless warnings are silenced in one place (:mod:`rlhf_lit.expected_warnings`); TensorBoard gets
  no placeholder ``hp_metric``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlparse

from jsonargparse import ArgumentParser
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks.progress import ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.exceptions import SIGTERMException

import rlhf_lit.data  # noqa: F401  (the data modules: known subclasses, so --data takes short names)
import rlhf_lit.stages  # noqa: F401  (the stages, likewise for --model)
from rlhf_lit.callable_specs import import_class
from rlhf_lit.callbacks.preemption import Preemption, exit_status
from rlhf_lit.callbacks.progress import RunProgressBar
from rlhf_lit.cli import jsonargparse_fixes
from rlhf_lit.cli.option_names import class_options, parser_options
from rlhf_lit.cli.parser_errors import condense_parser_error
from rlhf_lit.cli.resume_check import check_checkpoints_when_loaded, check_resume_checkpoint
from rlhf_lit.cli.run_dir import (
    RUN_DIR_KEY,
    add_run_dir_argument,
    apply_run_dir,
    stage_dir,
    stage_layout,
    stage_title,
    with_run_dir_hint,
)
from rlhf_lit.cli.run_lock import lock_run, release_run_locks
from rlhf_lit.commands import COMMANDS, commands_help, run_command
from rlhf_lit.expected_warnings import silence_expected_noise
from rlhf_lit.run_seed import CLI_DEFAULT_SEED, run_seed, run_seed_problem
from rlhf_lit.stages.base import TrainerPlan
from rlhf_lit.stages.nonfinite import NonFiniteError
from rlhf_lit.strategies import check_strategy_choice, shards_models  # also registers the fsdp / fsdp2 names

DEFAULT_LOGGER = {
    "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
    # No hp_metric: TensorBoard would show a placeholder -1 that no stage ever updates.
    "init_args": {"save_dir": "logs", "name": "rlhf-lit", "default_hp_metric": False},
}
DEBUG_FLAG, DEBUG_ENV = "--debug", "RLHF_LIT_DEBUG"
_debug = False  # set by main(): --debug / RLHF_LIT_DEBUG
EXPECTED_ERRORS = (ValueError, OSError, ImportError, MisconfigurationException, NonFiniteError)
"""Errors a user can act on (bad values, files, models, data, a run stopped by NaN): one line, no traceback."""
jsonargparse_fixes.install()  # nested options keep null / lists / dicts; config mistakes name file and line


def debug_enabled(argv: list[str]) -> bool:
    """``--debug`` on the command line or ``RLHF_LIT_DEBUG`` set to a true value."""
    return DEBUG_FLAG in argv or os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _subcommand_parsers(parser: ArgumentParser) -> dict[str, ArgumentParser]:
    """The parsers of the subcommands (``fit``, ``validate``, ...) by name; empty for a subcommand's own."""
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def _subcommand_parser(parser: ArgumentParser, given_args: Sequence[str]) -> ArgumentParser:
    """The parser of the subcommand on the command line (``fit``), or the parser itself."""
    subcommands = _subcommand_parsers(parser)
    name = next((a for a in given_args if a in subcommands), None)
    return subcommands[name] if name is not None else parser


class ConciseArgumentParser(LightningArgumentParser):
    """A LightningArgumentParser whose errors are one line (the full report with ``--debug``).

    ``given_args`` is set to the command line when parsing starts (:meth:`RLHFCLI.parse_arguments`),
    so an error can say where a bad key was given.
    """

    given_args: Sequence[str] = ()

    def options_in(self, class_path: str | None) -> list[str]:
        """The keys a class takes (the command's own options for None): what a wrong key is compared with."""
        if class_path:
            return class_options(class_path)
        return parser_options(_subcommand_parser(self, self.given_args))

    def error(self, message: str, ex: Exception | None = None):
        """Print ``rlhf-lit: error: <cause>`` and exit 2, unless debugging or the caller catches errors."""
        if not self.exit_on_error or _debug:
            return super().error(message, ex)
        try:
            told = condense_parser_error(message, self.given_args, self.options_in)
        except Exception:  # noqa: BLE001  (a report of a shape not met before: its first line, never a traceback)
            told = next((line.strip() for line in message.splitlines() if line.strip()), message)
        sys.stderr.write(
            f"rlhf-lit: error: {told}\n"
            f"(`{self.prog.replace(' [options]', '')} --help` lists the options; {DEBUG_FLAG} shows the full report)\n"
        )
        sys.exit(2)


def refuse_remote_checkpoint(ckpt_path: str | None) -> None:
    """Refuse a checkpoint URL: Lightning would unpickle it in full, and a checkpoint can carry code."""
    if ckpt_path and urlparse(str(ckpt_path)).scheme not in ("", "file") and "://" in str(ckpt_path):
        raise ValueError(
            f"--ckpt_path {ckpt_path}: remote checkpoints are not loaded (a checkpoint is unpickled in full, "
            "so it can run code); download it, check where it comes from, and pass the local file"
        )


def stage_refusal(model: Mapping[str, Any] | None, trainer: Mapping[str, Any]) -> str | None:
    """The refusal of the stage the config names (:meth:`~rlhf_lit.stages.base.StageModule.refusal_before_build`:
    PPO's ``--trainer.max_steps``, its compiled passes under FSDP), or None. The CLI reads no stage's
    option names: it hands the stage its parsed ``init_args`` and what it knows of the Trainer."""
    # jsonargparse has resolved short names; a bad class is not ours to report: instantiation names it
    ask = getattr(import_class((model or {}).get("class_path") or ""), "refusal_before_build", None)
    if ask is None:  # not a StageModule: nothing of ours to ask
        return None
    plan = TrainerPlan(max_steps=trainer.get("max_steps"), shards_models=shards_models(trainer.get("strategy")))
    return ask((model or {}).get("init_args") or {}, plan)


def config_callbacks(trainer_config: dict) -> list:
    """The callbacks the trainer config lists (one given alone, or none, as a list)."""
    callbacks = trainer_config.get("callbacks") or []
    return callbacks if isinstance(callbacks, list) else [callbacks]


def default_progress_bar(trainer_config: dict) -> ProgressBar | None:
    """:class:`RunProgressBar`, unless the config turns the bar off or lists a progress bar of its own."""
    if trainer_config.get("enable_progress_bar") is False:
        return None
    return None if any(isinstance(c, ProgressBar) for c in config_callbacks(trainer_config)) else RunProgressBar()


def launched_processes() -> int:
    """How many processes an outside launcher started for this run (torchrun's ``WORLD_SIZE``, SLURM's
    ``SLURM_NTASKS``); 1 when the run is launched by Lightning or by hand."""
    for name in ("WORLD_SIZE", "SLURM_NTASKS"):
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 1


def added_callbacks(trainer_config: dict, command: Sequence[str] | None) -> list:
    """The callbacks rlhf-lit adds to the config's: :class:`RunProgressBar` (see
    :func:`default_progress_bar`) and :class:`Preemption`, unless the config lists one."""
    bar = default_progress_bar(trainer_config)
    added = [] if bar is None else [bar]
    if not any(isinstance(c, Preemption) for c in config_callbacks(trainer_config)):
        added.append(Preemption(command))
    return added


class RLHFCLI(LightningCLI):
    """LightningCLI that links each stage's tokenizer into its data module, asks the stage to refuse a
    command line before anything is built (:func:`stage_refusal`) and installs :class:`RunProgressBar`
    and :class:`Preemption`.

    ``command`` is the command line the run was started with (``rlhf-lit`` and its arguments): the
    preemption message turns it into the resume command. The other arguments are LightningCLI's.
    """

    def __init__(self, *args, command: Sequence[str] | None = None, **kwargs) -> None:
        self.command = command  # before LightningCLI's __init__, which runs everything
        super().__init__(*args, **kwargs)

    def subcommands(self) -> dict[str, set[str]]:
        """Lightning's subcommands (``fit``, ``validate``, ``test``, ``predict``) and the arguments each
        skips; only the one the command line starts with, when it starts with one (``rlhf-lit fit ...``).

        Each subcommand's parser takes the signatures of the trainer, every stage and data module, and a
        run parses with one: ``fit --config configs/offline/ppo.yaml --print_config`` took 0.56 s against
        0.77 s with all four on a development machine (``bench/cli_parse.py``). Any other command line
        (``--help``, a mistyped subcommand, an option first) gets all four, so the choices listed are
        Lightning's."""
        every = LightningCLI.subcommands()
        first = self.command[1] if self.command and len(self.command) > 1 else None
        return {first: every[first]} if first in every else every

    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        """Parse, keeping the command line on the parser and its subcommands' (``fit`` parses the config
        files): their errors say where a bad key was given."""
        given = list(sys.argv[1:] if args is None else args)
        for each in (parser, *_subcommand_parsers(parser).values()):
            each.given_args = given
        super().parse_arguments(parser, args)

    def add_arguments_to_parser(self, parser) -> None:
        """Link `model.tokenizer` (built in the stage's __init__) to the data module's `tokenizer`."""
        parser.link_arguments("model.tokenizer", "data.init_args.tokenizer", apply_on="instantiate")
        add_run_dir_argument(parser)  # --run_dir: one directory per experiment (rlhf_lit.cli.run_dir)

    def _subcommand_config(self) -> tuple[str | None, Any]:
        """The subcommand run (``fit``; None without one) and its part of the parsed config."""
        subcommand = self.config.get("subcommand")
        return subcommand, self.config[subcommand] if subcommand else self.config

    def before_instantiate_classes(self) -> None:
        """Refuse ``--trainer.strategy fsdp`` without GPUs (names ``fsdp2``), and what the stage refuses
        (:func:`stage_refusal`), before anything is built; with ``--run_dir``, fill the config from it and
        take the run directory's lock for the stage (:mod:`rlhf_lit.cli.run_lock`)."""
        subcommand, config = self._subcommand_config()
        trainer = config.get("trainer", {})
        check_strategy_choice(trainer.get("strategy"), trainer.get("accelerator", "auto"))
        refusal = stage_refusal(config.get("model"), trainer)
        if refusal:
            self.parser.error(refusal)  # an option error: one line, exit 2, before any model is built
        # --run_dir: fill unset outputs and inputs, refuse contradicting ones (rlhf_lit.cli.run_dir)
        apply_run_dir(config, self.trainer_defaults, subcommand)
        if subcommand == "fit" and config.get(RUN_DIR_KEY):  # one fit per run directory and stage at once
            stage = stage_layout(str(config["model"]["class_path"])).name
            lock_run(
                stage_dir(config[RUN_DIR_KEY], stage),
                f"--run_dir {config[RUN_DIR_KEY]}: the {stage_title(stage)} stage",
                self.command,
            )

    def _set_seed(self) -> None:
        """Lightning's ``seed_everything``, refusing ``--seed_everything true`` in a run whose processes a
        launcher started one by one (torchrun, ``srun``): ``true`` leaves the seed to each process
        (Lightning 2.4 and earlier draw it at random, later versions take 0), and the data order and
        split follow it (:mod:`rlhf_lit.run_seed`), so the ranks could read overlapping data. Under
        Lightning's own launcher the processes inherit rank 0's seed. The seed ``true`` chose is added
        to the resume command the preemption stop logs, so the resumed run draws the same data."""
        _, config = self._subcommand_config()
        drawn = config.get("seed_everything") is True
        if problem := run_seed_problem(config.get("seed_everything"), "--seed_everything"):
            self.parser.error(problem)
        if drawn and run_seed() is None and launched_processes() > 1:
            self.parser.error(
                f"--seed_everything true leaves the seed to each of the {launched_processes()} processes the launcher "
                "started, and the data order follows it; give the seed as a number (--seed_everything 1234)"
            )
        super()._set_seed()
        if drawn and self.command is not None:
            self.command = [*self.command, "--seed_everything", str(config.get("seed_everything"))]

    def instantiate_trainer(self, **kwargs) -> Trainer:
        """The Trainer, with :func:`added_callbacks` after the config's callbacks, and a strategy that checks a
        checkpoint before loading it (:func:`~rlhf_lit.cli.resume_check.check_checkpoints_when_loaded`)."""
        trainer_config = self._get(self.config_init, "trainer", default={})
        added = added_callbacks(trainer_config, self.command)
        if added and "callbacks" not in kwargs:
            kwargs["callbacks"] = [*config_callbacks(trainer_config), *added]
        trainer = super().instantiate_trainer(**kwargs)
        given = self._subcommand_config()[1].get("ckpt_path")  # last / best: checked where Lightning loads it
        check_checkpoints_when_loaded(trainer.strategy, self.command, None if given is None else str(given))
        return trainer

    def _parse_ckpt_path(self) -> None:
        """Check ``--ckpt_path``; do NOT merge the checkpoint's hyperparameters into the config.

        LightningCLI would parse the checkpoint's hyperparameters over the given config, so a
        resume would silently ignore a changed option (and fails for a stage whose hyperparameters
        it cannot parse). A missing or damaged checkpoint is refused here, before any model is built
        (:mod:`rlhf_lit.cli.resume_check`). Here the given config rules, and each stage compares it with the
        checkpoint when the checkpoint is loaded (:mod:`rlhf_lit.stages.resume`): differences that
        would break the run are refused, listed; safe ones (more rollouts, another export
        directory) are applied.
        """
        ckpt_path = self._subcommand_config()[1].get("ckpt_path")
        refuse_remote_checkpoint(ckpt_path)
        # a checkpoint cut short by a crash or a full disk: one line now, not torch's traceback later
        check_resume_checkpoint(ckpt_path, self.command)


def _raised_in_jsonargparse(error: BaseException) -> bool:
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and f"{os.sep}jsonargparse{os.sep}" in tb.tb_frame.f_code.co_filename


def user_facing_error(error: BaseException) -> BaseException:
    """The error to report: the first in the chain not raised by jsonargparse.

    An error raised in a stage's ``__init__`` reaches the CLI wrapped by jsonargparse ("Does not
    validate against any of the Union subtypes ... Given value: <the whole config>"); the user
    needs the stage's own message.
    """
    seen = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if not _raised_in_jsonargparse(current):
            return current
        current = current.__cause__ or current.__context__
    return error


def configure_logging() -> None:
    """Show rlhf-lit's INFO messages (record counts, pad policy, exports) on stderr."""
    logger = logging.getLogger("rlhf_lit")
    if not any(getattr(h, "_rlhf_lit", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[rlhf-lit] %(message)s"))
        handler._rlhf_lit = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def main(args: list[str] | None = None) -> None:
    """Entry point of the `rlhf-lit` console script."""
    global _debug
    argv = list(sys.argv[1:] if args is None else args)
    debug = _debug = debug_enabled(argv)
    if debug:
        os.environ[DEBUG_ENV] = "1"  # for the processes a DDP launcher starts from sys.argv
    argv = [a for a in argv if a != DEBUG_FLAG]
    if args is None:
        sys.argv[1:] = argv  # LightningCLI reads sys.argv itself (and warns when given both)
    configure_logging()
    silence_expected_noise()
    if argv[:1] and argv[0] in COMMANDS:  # `rlhf-lit evaluate ...`: argparse commands (rlhf_lit/commands/)
        status = run_command(argv[0], argv[1:], debug)
        if status:
            sys.exit(status)
        return
    if argv == ["--version"]:
        from rlhf_lit import __version__

        print(f"rlhf-lit {__version__}")
        return
    if not argv or argv[0] in ("-h", "--help"):
        print(commands_help() + "\n")
    try:
        _run_cli(args, argv, debug)
    finally:
        release_run_locks()  # the run directory's lock (--run_dir), however the run ended


def _run_cli(args: list[str] | None, argv: list[str], debug: bool) -> None:
    """The LightningCLI run of ``argv``, its user errors reported as one line (module docstring)."""
    try:
        RLHFCLI(
            LightningModule,
            LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            parser_class=ConciseArgumentParser,
            trainer_defaults={"logger": DEFAULT_LOGGER, "default_root_dir": "logs"},
            # The stages build their own optimizers and schedules: no --optimizer / --lr_scheduler.
            auto_configure_optimizers=False,
            save_config_kwargs={"overwrite": True},
            # A fixed default seed: two runs of one config sample the same prompts and responses.
            seed_everything_default=CLI_DEFAULT_SEED,
            args=args and argv,
            command=["rlhf-lit", *argv],
        )
    except SIGTERMException as stop:
        if stop.code not in (None, 0):
            raise  # Preemption's stop: checkpoint written, message logged, status 128 + signal
        # Lightning's own stop: the signal came while Lightning's handler was still in place (the
        # sanity check before training), so no step was taken and nothing is lost; status as if killed.
        sys.stderr.write(
            "rlhf-lit: stopped by SIGTERM before training began; nothing new to save, run the same command again\n"
        )
        sys.exit(exit_status(signal.SIGTERM))
    except EXPECTED_ERRORS as error:
        if debug:
            raise
        cause = with_run_dir_hint(user_facing_error(error))
        if not isinstance(cause, EXPECTED_ERRORS):
            raise cause from None  # a bug or an environment failure (out of memory ...): its traceback
        sys.stderr.write(f"rlhf-lit: error: {cause}\n(run with {DEBUG_FLAG} for the traceback)\n")
        sys.exit(1)


if __name__ == "__main__":
    main()

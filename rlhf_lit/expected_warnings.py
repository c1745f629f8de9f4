"""The one place where rlhf-lit silences warnings and notices that are expected and harmless.

Each entry matches one message (not a whole category or module), says why it is harmless here,
and is installed by :func:`silence_expected_noise`, which the CLI calls before building anything.
Everything else (a warning a user must act on) still shows. pytest's configuration in
``pyproject.toml`` (``filterwarnings``) lists the same messages for the test run.

Kept on purpose (a user must act on them or needs to know): Lightning's "GPU available" / "Seed
set" lines, ``Trainer.fit stopped: ...``, a transformers load report of any checkpoint that lacks
weights the run needs (only a score head created on purpose is quiet: see
:func:`rlhf_lit.models.loading.load_reward_model`), and every ``[rlhf-lit]`` message.
"""

from __future__ import annotations

import logging
import warnings

EXPECTED_WARNINGS: tuple[tuple[str, str], ...] = (
    # The stages load Hugging Face models in eval mode on purpose: dropout is off in PPO (old and new
    # logprobs must agree) and the frozen reference / reward model never train; the stages switch the
    # trained models to train mode themselves where it matters (gradient checkpointing).
    (r"Found \d+ module\(s\) in eval mode at the start of training", "the stages own train/eval modes"),
    # Lightning 2.6's own use of a torch API that torch 2.10+ deprecates: nothing a user can change.
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", "inside Lightning, not rlhf-lit"),
    # PromptDataModule offers a val loader (evaluation prompts); PPOModule has no validation_step.
    (r"You passed in a `val_dataloader` but have no `validation_step`", "PPO validates nothing"),
    # PPO logs once per rollout itself (step = rollout index); SFT / RM log every log_every_n_steps
    # optimizer steps across epochs, so a short epoch loses nothing.
    (r"The number of training batches \(\d+\) is smaller than the logging interval", "logging is per step"),
)
"""(message regex, why it is harmless) of the warnings :func:`silence_expected_noise` hides."""

EXPECTED_LOG_PREFIXES: tuple[str, ...] = ("💡 Tip: For seamless cloud logging",)
"""Starts of Lightning INFO messages that advertise a product rather than report on the run."""

_LIGHTNING_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


class _DropAdvertisement(logging.Filter):
    """Drops log records whose message starts with one of :data:`EXPECTED_LOG_PREFIXES`."""

    def filter(self, record: logging.LogRecord) -> bool:
        """False (drop) for an advertisement, True for everything else."""
        return not str(record.getMessage()).startswith(EXPECTED_LOG_PREFIXES)


def silence_expected_noise() -> None:
    """Install the filters for :data:`EXPECTED_WARNINGS` and :data:`EXPECTED_LOG_PREFIXES` (idempotent).

    Warnings filters are inherited by processes a DDP launcher starts from ``sys.argv`` because
    they run the CLI again, which calls this again.
    """
    for message, _why in EXPECTED_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    for name in _LIGHTNING_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropAdvertisement) for f in logger.filters):
            logger.addFilter(_DropAdvertisement())

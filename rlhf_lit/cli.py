"""The `rlhf-lit` command: LightningCLI with the stage and data classes chosen by `class_path`.

    rlhf-lit fit --config configs/sft.yaml
    rlhf-lit fit --config configs/ppo.yaml --trainer.strategy ddp --trainer.devices 2
    rlhf-lit fit --config configs/rm.yaml --print_config

Stages never import data modules; this file wires them: the stage loads the tokenizer (with its
pad policy) and the data module receives that very object, so a run has one tokenizer.
"""

from __future__ import annotations

from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI

DEFAULT_LOGGER = {
    "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
    "init_args": {"save_dir": "logs", "name": "rlhf-lit"},
}


class RLHFCLI(LightningCLI):
    """LightningCLI that links each stage's tokenizer into its data module."""

    def add_arguments_to_parser(self, parser) -> None:
        """Link `model.tokenizer` (built in the stage's __init__) to the data module's `tokenizer`."""
        parser.link_arguments("model.tokenizer", "data.init_args.tokenizer", apply_on="instantiate")


def main(args: list[str] | None = None) -> None:
    """Entry point of the `rlhf-lit` console script."""
    RLHFCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        trainer_defaults={"logger": DEFAULT_LOGGER, "default_root_dir": "logs"},
        save_config_kwargs={"overwrite": True},
        # A fixed default seed: two runs of one config sample the same prompts and responses.
        seed_everything_default=1234,
        args=args,
    )


if __name__ == "__main__":
    main()

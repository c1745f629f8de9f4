"""``rlhf-lit export-policy``: the policy of a training checkpoint as a Hugging Face export.

    rlhf-lit export-policy --checkpoint logs/ppo/checkpoints/rollout=20.ckpt \\
        --base-model logs/sft/model --out logs/ppo/rollout_20
    rlhf-lit export-policy --checkpoint logs/ppo/checkpoints --base-model logs/sft/model --out logs/ppo/along

A checkpoint file gives one export at ``--out``; a folder of ``RolloutCheckpoint`` files
(``rollout=<n>.ckpt``) gives one export per file, ``<out>/rollout_<n>``. Each is the policy's
weights (``--prefix``: ``policy.`` for PPO, ``model.`` for SFT and DPO) loaded strictly over
``--base-model`` (the model the run started from), with its tokenizer, written as a stage writes its
export (atomic, with the export marker; ``--overwrite`` replaces only an earlier export). Evaluate the
exports on one prompt file with ``rlhf-lit evaluate`` (e.g. along training: the reward-KL frontier).

This module is the argparse shell: it checks the options and every target before loading anything,
then calls :func:`rlhf_lit.stages.checkpoint_export.export_checkpoint_policy`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from rlhf_lit.commands.options import CommandParser, OptionError, check_sources

log = logging.getLogger(__name__)


def build_parser() -> CommandParser:
    """The options of ``rlhf-lit export-policy``."""
    from rlhf_lit.models.checkpoint_policy import POLICY_PREFIX

    parser = CommandParser(
        prog="rlhf-lit export-policy",
        description="Write the policy of a training checkpoint (or of every rollout=<n>.ckpt in a folder) as a "
        "Hugging Face export that rlhf-lit evaluate, a later stage or from_pretrained loads.",
    )
    parser.add_argument(
        "--checkpoint",
        required=True,
        metavar="CKPT|DIR",
        help="a Lightning .ckpt file, or a folder of RolloutCheckpoint files rollout=<n>.ckpt",
    )
    parser.add_argument(
        "--base-model",
        required=True,
        metavar="DIR",
        help="the model the run started from (PPO: its sft_model): the architecture and the tokenizer",
    )
    parser.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="the export folder (a folder of checkpoints: the parent of one rollout_<n> per file)",
    )
    parser.add_argument(
        "--prefix",
        default=POLICY_PREFIX,
        help="where the stage keeps the policy in its state_dict: policy. (PPO), model. (SFT, DPO)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier rlhf-lit export at the target")
    return parser


def targets(checkpoint: str, out: str) -> dict[str, str]:
    """``checkpoint file -> export folder``: one, or one ``<out>/rollout_<n>`` per ``rollout=<n>.ckpt`` of a folder."""
    from rlhf_lit.models.checkpoint_policy import rollout_checkpoints

    if not os.path.exists(checkpoint):
        raise OptionError(f"--checkpoint {checkpoint}: no such file or folder")
    if not os.path.isdir(checkpoint):
        return {checkpoint: out}
    if os.path.isfile(os.path.join(checkpoint, ".metadata")):
        raise OptionError(
            f"--checkpoint {checkpoint} is a sharded (FSDP) checkpoint; give a single-file checkpoint "
            "(save_weights_only, or Lightning's consolidate_checkpoint)"
        )
    found = rollout_checkpoints(checkpoint)
    if not found:
        raise OptionError(f"--checkpoint {checkpoint}: a folder without rollout=<n>.ckpt files")
    return {path: os.path.join(out, f"rollout_{rollout}") for rollout, path in found.items()}


def main(argv: Sequence[str]) -> int:
    """Run ``rlhf-lit export-policy`` with ``argv`` (the options after the command name); returns the exit status."""
    from rlhf_lit.artifacts import EXPORT_MARKER, directory_state
    from rlhf_lit.stages.checkpoint_export import export_checkpoint_policy

    args = build_parser().parse_args(list(argv))
    exports = targets(args.checkpoint, args.out)
    for target in exports.values():  # every target checked before the first export is written
        state = directory_state(target, EXPORT_MARKER)
        if state == "not_a_directory":
            raise OptionError(f"--out {target} exists and is not a folder")
        if state == "foreign":
            raise OptionError(f"--out {target} is not empty and was not written by rlhf-lit; it is never replaced")
        if state == "owned" and not args.overwrite:
            raise OptionError(f"--out {target} holds an earlier rlhf-lit export; pass --overwrite to replace it")
    check_sources(base_model=args.base_model)
    for checkpoint, target in exports.items():
        try:
            written = export_checkpoint_policy(
                checkpoint,
                args.base_model,
                target,
                prefix=args.prefix,
                existing="replace" if args.overwrite else "refuse",
            )
        except (KeyError, RuntimeError) as error:  # nothing under --prefix, or weights that do not fit the base model
            message = str(error.args[0] if isinstance(error, KeyError) else error).splitlines()[0]
            raise ValueError(
                f"--checkpoint {checkpoint}: {message} (--prefix {args.prefix}, --base-model {args.base_model})"
            ) from None
        print(f"{checkpoint} -> {written}")
    return 0

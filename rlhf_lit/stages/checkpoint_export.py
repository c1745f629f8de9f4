"""Writing the policy of a training checkpoint as an export (``rlhf-lit export-policy``).

The policy is read by :func:`rlhf_lit.models.checkpoint_policy.load_checkpoint_policy` and written
with the base model's tokenizer as every stage writes its final model
(:func:`rlhf_lit.stages.export.save_pretrained_atomically`: atomic, with the export marker, never
over a folder rlhf-lit did not write): a policy along training then loads, evaluates
(``rlhf-lit evaluate``) and trains on like a stage's export.
"""

from __future__ import annotations

import os
from pathlib import Path

from rlhf_lit.models.checkpoint_policy import POLICY_PREFIX, load_checkpoint_policy
from rlhf_lit.stages.export import ExportExisting, check_export_target, save_pretrained_atomically


def export_checkpoint_policy(
    checkpoint: str | os.PathLike,
    base_model: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    prefix: str = POLICY_PREFIX,
    existing: ExportExisting = "refuse",
) -> Path:
    """Write the policy of ``checkpoint`` (loaded over ``base_model``) and ``base_model``'s tokenizer to ``out_dir``.

    Args:
        checkpoint: a Lightning ``.ckpt`` file of the run.
        base_model: the Hugging Face directory the run's policy started from (PPO: its ``sft_model``).
        out_dir: the export folder: absent, empty, or an earlier rlhf-lit export (``existing="replace"``).
        prefix: where the stage keeps the policy in its ``state_dict`` (``policy.`` for PPO, ``model.``
            for SFT and DPO).
        existing: ``refuse`` or ``replace`` an earlier export at ``out_dir``.

    Returns:
        The absolute path of the export.
    """
    from transformers import AutoTokenizer

    check_export_target(out_dir, existing)  # before loading anything: a refusal costs nothing
    model = load_checkpoint_policy(checkpoint, base_model, prefix)
    tokenizer = AutoTokenizer.from_pretrained(base_model)
    return save_pretrained_atomically(model, tokenizer, out_dir, what=f"the policy of {checkpoint}", existing=existing)

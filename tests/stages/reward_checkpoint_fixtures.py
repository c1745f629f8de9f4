"""The reward-model checkpoints of tests/stages/reward_checkpoints/ and how they were made.

``test_reward_checkpoints.py`` loads them with the current code: a checkpoint a user wrote with an
earlier rlhf-lit must keep loading (``load_from_checkpoint``) and resuming (``--ckpt_path``), and give
the scores it gave then. Three kinds, one per reward head: ``plain`` (one reward model, normalised
``gain_bias``), ``ensemble`` (2 members, bootstrap weights, per-member ``gain_bias``) and ``odin``
(two score rows while training, ``bias``). Each is a fit on a tiny random Llama (2 layers, width 16,
the stories260K tokenizer; ``start_model/``), saved at step 2 of 3 with its optimizer states and with
the reward normalised on the reference batch just before the save (so the gain and bias buffers
hold real values). ``expected.json`` holds what that code computed: the raw and normalised scores
of the probe batch from the checkpoint, and after resuming it for the last step (pair batch, then
ranking batch, then the pair batch again) the normalised scores, the buffers left after the fold and
the logged ``train/*`` metrics of that step.

Regenerate (with the checkout whose checkpoint format is wanted; ``OMP_NUM_THREADS=1``), from the
repository root::

    OMP_NUM_THREADS=1 PYTHONPATH=tests .venv/bin/python tests/stages/reward_checkpoint_fixtures.py

(Named ``<kind>.fixture.pt``, not ``.ckpt``: a ``*.ckpt`` is run output, which git ignores; these are fixtures.)
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import lightning.pytorch as pl
import torch
from assets_paths import ROOT, STORIES260K
from torch.utils.data import DataLoader

from rlhf_lit.models import sequence_scores

FIXTURES = Path("tests/stages/reward_checkpoints")
"""Relative to the repository root: the checkpoints record the start model by this relative path."""
START_MODEL = FIXTURES / "start_model"
KINDS = {
    "plain": {"normalize": "gain_bias"},
    "ensemble": {"normalize": "gain_bias", "ensemble": {"members": 2, "seeds": [5, 6], "data_weights": "bootstrap"}},
    "odin": {"normalize": "bias", "length_debias": {"method": "odin", "correlation_weight": 0.7}},
}
"""The stage's arguments of each kind beside ``model`` and ``optimizer`` (plain dicts, as a YAML gives them)."""
OPTIMIZER = {"lr": 1e-2, "schedule": "constant"}
SAVED_AT, MAX_STEPS = 2, 3
PAIRS = [
    ("Tom went out.", " He was happy.", " He was sad and he cried all day long."),
    ("Lily", " smiled and sang a song with her mom.", " cried."),
]
RANKING = [("The dog", [" ran to the park.", " sat.", " barked at a big red ball."], [0, 1, 1])]
PROBE = ["Once upon a time there was a cat.", "Tom ran.", "Lily saw a big red ball in the park.", "The dog barked."]


def make_start_model(path: Path) -> None:
    """A tiny random LlamaForCausalLM (seed 0) with the stories260K tokenizer files."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(STORIES260K / name, path / name)


def _pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``(input_ids, attention_mask)``."""
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), T), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return ids, mask


def _encode(tokenizer, prompt: str, response: str) -> tuple[list[int], list[int]]:
    return tokenizer(prompt).input_ids, tokenizer(response, add_special_tokens=False).input_ids + [
        tokenizer.eos_token_id
    ]


def pair_batch(tokenizer) -> dict[str, torch.Tensor]:
    """:data:`PAIRS` as a preference batch (docs/CONTRACTS.md), chosen and rejected padded to one T."""
    chosen, rejected, prompt_length = [], [], []
    for prompt, good, bad in PAIRS:
        p, c = _encode(tokenizer, prompt, good)
        _, r = _encode(tokenizer, prompt, bad)
        chosen.append(p + c)
        rejected.append(p + r)
        prompt_length.append(len(p))
    ids, mask = _pad(chosen + rejected, tokenizer.pad_token_id)
    B = len(PAIRS)
    return {
        "chosen_input_ids": ids[:B],
        "chosen_attention_mask": mask[:B],
        "rejected_input_ids": ids[B:],
        "rejected_attention_mask": mask[B:],
        "prompt_length": torch.tensor(prompt_length),
    }


def ranking_batch(tokenizer) -> dict[str, torch.Tensor]:
    """:data:`RANKING` as a ranking batch (one prompt: its rows in order, position-major trivially)."""
    ((prompt, responses, ranks),) = RANKING
    rows, prompt_length = [], []
    for response in responses:
        p, r = _encode(tokenizer, prompt, response)
        rows.append(p + r)
        prompt_length.append(len(p))
    ids, mask = _pad(rows, tokenizer.pad_token_id)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "group": torch.zeros(len(rows), dtype=torch.long),
        "rank": torch.tensor(ranks),
        "responses_per_prompt": torch.tensor([len(rows)]),
        "prompt_length": torch.tensor(prompt_length),
    }


def probe_batch(tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """:data:`PROBE` (each with EOS) as right-padded rows: what the scores are read on; also the
    reference set of the normalisation."""
    return _pad([tokenizer(t).input_ids + [tokenizer.eos_token_id] for t in PROBE], tokenizer.pad_token_id)


class FixtureData(pl.LightningDataModule):
    """Training batches (pairs, then a ranking), the pairs for validation, the probe as reference set."""

    def __init__(self, tokenizer) -> None:
        super().__init__()
        self.batches = [pair_batch(tokenizer), ranking_batch(tokenizer)]
        ids, mask = probe_batch(tokenizer)
        self.reference = [{"input_ids": ids, "attention_mask": mask}]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.batches, batch_size=None)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.batches[:1], batch_size=None)

    def reference_dataloader(self) -> DataLoader:
        return DataLoader(self.reference, batch_size=None)


def trainer(root: str | Path, callbacks: list | None = None) -> pl.Trainer:
    """The single-process CPU trainer of the fixture runs (and of the resume in the test)."""
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        max_steps=MAX_STEPS,
        default_root_dir=str(root),
        num_sanity_val_steps=0,
        check_val_every_n_epoch=100,
        callbacks=callbacks,
    )


def module(kind: str, root: Path):
    """The stage of ``kind``, exporting under ``root``."""
    from rlhf_lit.stages import RewardModelModule

    pl.seed_everything(0)
    return RewardModelModule(str(START_MODEL), optimizer=OPTIMIZER, export_dir=str(root / kind), **KINDS[kind])


class SaveNormalised(pl.Callback):
    """At step :data:`SAVED_AT`: normalise on the reference set, save the checkpoint, read the probe."""

    def __init__(self, path: Path) -> None:
        self.path, self.scores = path, {}

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if trainer.global_step != SAVED_AT:
            return
        module.normalize(trainer.datamodule.reference_dataloader(), "fixture probe")
        trainer.save_checkpoint(self.path)
        ids, mask = probe_batch(module.tokenizer)
        with torch.no_grad():
            self.scores = {"raw": module.raw_scores(ids, mask).tolist(), "normalised": module(ids, mask).tolist()}
            if getattr(getattr(module.model, "config", None), "num_labels", 1) == 2:  # ODIN: quality, length rows
                self.scores["heads"] = sequence_scores(module.model, ids, mask).tolist()


def main() -> None:
    """Write ``start_model/``, ``<kind>.ckpt`` and ``expected.json`` under :data:`FIXTURES`."""
    os.chdir(ROOT)
    if START_MODEL.exists():
        shutil.rmtree(START_MODEL)
    make_start_model(START_MODEL)
    expected = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in KINDS:
            path = FIXTURES / f"{kind}.fixture.pt"
            saver = SaveNormalised(path)
            first = module(kind, Path(tmp) / "first")
            trainer(Path(tmp) / kind, [saver]).fit(first, datamodule=FixtureData(first.tokenizer))
            resumed = module(kind, Path(tmp) / "resumed")
            fit = trainer(Path(tmp) / kind)
            fit.fit(resumed, datamodule=FixtureData(resumed.tokenizer), ckpt_path=path)
            ids, mask = probe_batch(resumed.tokenizer)
            with torch.no_grad():
                after = resumed(ids, mask).tolist()
            expected[kind] = {
                "at_checkpoint": saver.scores,
                "resumed": {
                    "normalised": after,
                    "reward_gain": resumed.reward_gain.tolist(),
                    "reward_bias": resumed.reward_bias.tolist(),
                    "logged": {k: float(v) for k, v in sorted(fit.callback_metrics.items()) if k.startswith("train/")},
                },
            }
    (FIXTURES / "expected.json").write_text(json.dumps(expected, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

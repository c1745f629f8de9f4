"""A checkpoint written before format ``auto`` (its data hyperparameters say ``format: fields``, the
default then) resumes under the new default exactly when ``auto`` reads the data as ``fields``.

The data module records the format ``auto`` picked in its hyperparameters during ``setup``, which
Lightning runs before it restores a checkpoint, so the stages' resume check
(:func:`rlhf_lit.stages.resume.check_module_resume`) compares what the data was read as."""

import json

import lightning as L
import pytest
import torch

from rlhf_lit.data import PreferenceDataModule, PromptDataModule, SFTDataModule
from rlhf_lit.stages.resume import ResumeMismatch, check_module_resume, check_resume

FIELDS = {
    "prompt": "prompt",
    "response": "response",
    "chosen": "chosen",
    "rejected": "rejected",
    "margin": None,
    "text": "text",
}


def older(module: str, train_path: str) -> dict:
    """The data hyperparameters rlhf-lit wrote before ``auto`` for a module left at its defaults
    (printed from that version's modules, commit cf5d627)."""
    common = {
        "train_path": train_path,
        "val_path": None,
        "val_fraction": 0.0,
        "seed": None,
        "format": "fields",
        "split": "train",
        "subset": None,
        "max_records": None,
        "skip_invalid": False,
    }
    return {
        "sft": {
            **common,
            "prompt_words": 8,
            "apply_chat_template": False,
            "max_length": 512,
            "max_prompt_length": 256,
            "batch_size": 8,
            "num_workers": 0,
            "fields": FIELDS,
        },
        "preference": {
            **common,
            "apply_chat_template": False,
            "max_length": 512,
            "max_prompt_length": 256,
            "batch_size": 8,
            "num_workers": 0,
            "reference_path": None,
            "reference_format": "fields",
            "reference_max_records": None,
            "fields": FIELDS,
        },
        "prompt": {
            **common,
            "prompt_words": 8,
            "apply_chat_template": False,
            "max_prompt_length": 256,
            "batch_size": 8,
            "shuffle": True,
            "drop_last": True,
            "num_workers": 0,
            "ptx_path": None,
            "ptx_format": "fields",
            "ptx_max_records": None,
            "ptx_batch_size": None,
            "ptx_max_length": 512,
            "extra_fields": None,
            "fields": FIELDS,
        },
    }[module]


def now(module: str, train_path: str) -> dict:
    """What this version records for the same module: ``chat_template`` in place of the older
    ``apply_chat_template`` (false: the strings were kept as they are, ``never``)."""
    hparams = {k: v for k, v in older(module, train_path).items() if k != "apply_chat_template"}
    return {**hparams, "chat_template": "never"}


def _write(path, record) -> str:
    path.write_text(json.dumps(record) + "\n", encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    ("module", "kind", "record"),
    [
        (SFTDataModule, "sft", {"prompt": "Once upon a", "response": " time"}),
        (PreferenceDataModule, "preference", {"prompt": "Once upon a", "chosen": " time", "rejected": " day"}),
        (PromptDataModule, "prompt", {"prompt": "Once upon a"}),
    ],
)
def test_an_older_checkpoint_resumes_under_auto_when_auto_reads_fields(stories_tok, tmp_path, module, kind, record):
    path = _write(tmp_path / "d.jsonl", record)
    dm = module(tokenizer=stories_tok, train_path=path)
    dm.setup()
    assert dict(dm.hparams) == now(kind, path)  # what a checkpoint of this run records
    check_resume({"datamodule_hyper_parameters": older(kind, path)}, {}, dm.hparams, ())


def test_an_older_checkpoint_is_refused_when_auto_reads_the_data_otherwise(stories_tok, tmp_path):
    path = _write(tmp_path / "d.jsonl", {"prompt": "Once upon a", "completion": " time"})
    dm = SFTDataModule(tokenizer=stories_tok, train_path=path)
    dm.setup()
    with pytest.raises(ResumeMismatch, match=r"\n  data.format: checkpoint 'fields', now 'prompt_completion'\n"):
        check_resume({"datamodule_hyper_parameters": older("sft", path)}, {}, dm.hparams, ())


class _Stage(L.LightningModule):
    """A stage reduced to its resume check (the one the real stages run in ``on_load_checkpoint``)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))

    def training_step(self, batch, batch_idx):
        return (self.w**2).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_load_checkpoint(self, checkpoint):
        check_module_resume(self, checkpoint, ())


def test_lightning_resumes_an_older_checkpoint_with_format_left_unset(stories_tok, tmp_path):
    path = _write(tmp_path / "d.jsonl", {"prompt": "Once upon a", "response": " time"})

    def fit(max_steps, ckpt_path=None, **data):
        trainer = L.Trainer(
            max_steps=max_steps,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accelerator="cpu",
            default_root_dir=tmp_path,
            enable_checkpointing=False,
        )
        trainer.fit(_Stage(), SFTDataModule(tokenizer=stories_tok, train_path=path, **data), ckpt_path=ckpt_path)
        return trainer

    ckpt = tmp_path / "older.ckpt"
    fit(1, format="fields").save_checkpoint(ckpt)
    checkpoint = torch.load(ckpt, weights_only=False)
    assert checkpoint["datamodule_hyper_parameters"] == now("sft", path)
    checkpoint["datamodule_hyper_parameters"] = older("sft", path)  # as an older version wrote it
    torch.save(checkpoint, ckpt)
    assert fit(2, ckpt_path=ckpt).global_step == 2  # format left at auto: resumes
    _write(tmp_path / "d.jsonl", {"prompt": "Once upon a", "completion": " time"})  # same file, other shape
    with pytest.raises(ResumeMismatch, match="data.format: checkpoint 'fields', now 'prompt_completion'"):
        fit(3, ckpt_path=ckpt)

"""SFT and the reward model on 2 CPU processes from the command line, under ddp and under fsdp2.

Both strategies shard the data the same way (rlhf-lit's resumable sampler over 2 ranks) and
average the gradients, so their exports agree to float32 rounding; both moved away from the start.
``fsdp`` itself needs GPUs and is refused on CPU with one line naming ``fsdp2``.
"""

from __future__ import annotations

import pytest
import torch
from cli_helpers import HH_RLHF, STORIES, TINYSTORIES, error_line, rlhf_lit_forked, run_main, sft_config, write_yaml
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification


def rm_config(root, strategy: str) -> dict:
    """A reward model of a few steps on HH-RLHF pairs, stories260K with a fresh head, 2 processes."""
    config = sft_config(root, TINYSTORIES, max_steps=3)
    config["model"] = {
        "class_path": "rlhf_lit.stages.RewardModelModule",
        "init_args": {
            "model": str(STORIES),
            "optimizer": {"lr": 1.0e-3},
            "normalize": "gain_bias",
            "export_dir": str(root / "export"),
        },
    }
    config["data"] = {
        "class_path": "rlhf_lit.data.PreferenceDataModule",
        "init_args": {
            "train_path": str(HH_RLHF),
            "format": "hh_rlhf",
            "max_records": 48,
            "max_length": 96,
            "max_prompt_length": 64,
            "batch_size": 4,
            "reference_path": str(TINYSTORIES),
            "reference_format": "paragraphs",
            "reference_max_records": 16,
        },
    }
    config["trainer"].update(strategy=strategy, devices=2)
    return config


def stage_config(stage: str, root, strategy: str) -> dict:
    if stage == "rm":
        return rm_config(root, strategy)
    config = sft_config(root, TINYSTORIES, max_steps=3)
    config["trainer"].update(strategy=strategy, devices=2)
    return config


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["sft", "rm"])
def test_two_processes_under_ddp_and_fsdp2_train_the_same_model(stage, tmp_path):
    exports = {}
    for strategy in ("ddp", "fsdp2"):
        root = tmp_path / strategy
        write_yaml(root / "config.yaml", stage_config(stage, root, strategy))
        result = rlhf_lit_forked("fit", "--config", str(root / "config.yaml"), cwd=root)
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.count("[rlhf-lit] exported") == 1  # rank 0 only
        assert (root / "ckpt" / "last.ckpt").is_file()
        auto = AutoModelForSequenceClassification if stage == "rm" else AutoModelForCausalLM
        kwargs = {"num_labels": 1} if stage == "rm" else {}
        model = auto.from_pretrained(root / "export", **kwargs)
        exports[strategy] = model.state_dict()
        if stage == "rm":  # normalised on the reference set (every rank), the gain folded into the head
            assert model.config.rlhf_lit_reward_normalization["gain"] != 1.0
            exports[strategy]["reward_bias"] = torch.tensor(model.config.reward_bias)
    start = AutoModelForCausalLM.from_pretrained(STORIES).state_dict()  # the trunk keys match the RM's (model.*)
    for name, value in exports["ddp"].items():
        torch.testing.assert_close(exports["fsdp2"][name], value, rtol=1e-4, atol=1e-6, msg=name)
    moved = sum(not torch.equal(start[n], v) for n, v in exports["ddp"].items() if n in start)
    assert moved > 0  # trained: the trunk moved away from stories260K


def test_fsdp_on_cpu_is_refused_in_one_line_naming_fsdp2(tmp_path):
    config = sft_config(tmp_path, TINYSTORIES)
    config["trainer"].update(strategy="fsdp", devices=2)
    write_yaml(tmp_path / "sft.yaml", config)
    result = run_main("fit", "--config", str(tmp_path / "sft.yaml"), cwd=tmp_path)
    assert result.returncode == 1
    line = error_line(result)
    assert "--trainer.strategy fsdp needs CUDA GPUs" in line and "--trainer.strategy fsdp2" in line
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "export").exists()

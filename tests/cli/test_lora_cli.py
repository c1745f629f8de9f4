"""LoRA and the memory levers from the command line, as users type them (the CLI's main() in this process)."""

from __future__ import annotations

import torch
from cli_helpers import STORIES, TINYSTORIES, error_line, ppo_config, run_main, sft_config, write_yaml
from transformers import AutoModelForCausalLM


def test_ppo_with_lora_flags_exports_a_plain_transformers_model_and_resumes(tmp_path, stories_rm):
    write_yaml(tmp_path / "ppo.yaml", ppo_config(tmp_path, STORIES, stories_rm, max_rollouts=2))
    flags = [
        "--model.init_args.lora.r",
        "8",
        "--model.init_args.lora.alpha",
        "16",
        "--model.init_args.memory.gradient_checkpointing",
        "true",
    ]
    result = run_main("fit", "--config", str(tmp_path / "ppo.yaml"), *flags, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    export = tmp_path / "export"
    assert f"[rlhf-lit] exported PPO policy to {export}" in result.stdout
    model = AutoModelForCausalLM.from_pretrained(export)  # merged: plain transformers, no peft
    sft = AutoModelForCausalLM.from_pretrained(STORIES)
    assert not any("lora" in k for k in model.state_dict())
    assert any(not torch.equal(model.state_dict()[k], v) for k, v in sft.state_dict().items())  # trained
    # Resuming with the same flags is not refused (the LoRA settings are part of the checked config)...
    more = ["--model.init_args.export_existing", "replace"]  # max_rollouts is the linear schedule's length: kept
    resumed = run_main(
        "fit",
        "--config",
        str(tmp_path / "ppo.yaml"),
        *flags,
        *more,
        "--ckpt_path",
        str(tmp_path / "ckpt" / "last.ckpt"),
        cwd=tmp_path,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # ... and without them it is: a LoRA checkpoint cannot continue as a full fine-tune.
    refused = run_main(
        "fit",
        "--config",
        str(tmp_path / "ppo.yaml"),
        *more,
        "--ckpt_path",
        str(tmp_path / "ckpt" / "last.ckpt"),
        cwd=tmp_path,
    )
    assert refused.returncode == 1
    assert "cannot resume" in refused.stderr and "model.lora" in refused.stderr


def test_a_bad_lora_option_is_one_line_naming_it(tmp_path):
    write_yaml(tmp_path / "sft.yaml", sft_config(tmp_path, TINYSTORIES))
    result = run_main(
        "fit", "--config", str(tmp_path / "sft.yaml"), "--model.init_args.lora.target_modules", "[c_attn]", cwd=tmp_path
    )
    assert result.returncode == 1
    assert "lora.target_modules: no module of LlamaForCausalLM matches 'c_attn'" in error_line(result)


def test_sft_with_an_adapter_export(tmp_path):
    write_yaml(tmp_path / "sft.yaml", sft_config(tmp_path, TINYSTORIES, max_steps=2))
    result = run_main(
        "fit",
        "--config",
        str(tmp_path / "sft.yaml"),
        "--model.init_args.lora.r",
        "4",
        "--model.init_args.lora.export",
        "adapter",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    from peft import AutoPeftModelForCausalLM

    model = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "export")
    assert type(model.get_base_model()).__name__ == "LlamaForCausalLM"

"""LoRA under fsdp2 on 2 CPU processes from the command line: what the same run under ddp trains.

Each run is ``rlhf-lit fit`` in a process of its own (forked: tests/cli_forked.py; 2 processes over gloo). FSDP2 shards every
transformer block with its frozen base weights and its trainable adapters in one unit; the
optimizer holds the adapters only (and a reward model's head); the export gathers the shards on
rank 0 and merges or writes the adapter from an unsharded copy; PPO's reference is the sharded
policy with its adapters disabled. Exports and checkpoints must equal ddp's to float32 rounding.
Measured: DPO and the reward model bit-identical; PPO (LoRA on policy and critic, an embedding
adapter, gradient checkpointing) merged export within 9.5e-7 of a tensor's largest value (the
embedding; every other weight within 1.2e-7), its checkpoint's adapters within 9.2e-6 of theirs
(1.5e-5 under ``ATEN_CPU_CAPABILITY=default``: an adapter is a sum of small Adam steps, whose
size follows the rounding of the gradients' reductions). Tolerance: 1e-6 of each value plus 2e-6
of the tensor's largest value (about 16 float32 ulps; 1e-4 for the checkpoint's adapters, whose
product the merged export checks at the tighter one); training moved the weights by more than
1e-4. SFT shares DPO's stage path (``PretrainedStage``: sharding, optimizer, export).
"""

from __future__ import annotations

import csv
import json

import pytest
import torch
from cli_helpers import HH_RLHF, STORIES, TINYSTORIES, ppo_config, rlhf_lit_forked, sft_config, write_yaml
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

RTOL, ATOL = 1e-6, 2e-6
"""float32 rounding: relative to each value, plus ``ATOL`` times the tensor's largest value (see the module docstring)."""


def _fit(root, config: dict, *flags: str) -> None:
    write_yaml(root / "config.yaml", config)
    result = rlhf_lit_forked("fit", "--config", str(root / "config.yaml"), *flags, cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("[rlhf-lit] exported") == 1  # rank 0 only


def _preference_config(root, stage: str, strategy: str) -> dict:
    """DPO (adapter export) or the reward model (merged, normalised) on HH-RLHF pairs, LoRA r=4, 2 processes."""
    config = sft_config(root, TINYSTORIES, max_steps=3)
    model = config["model"]["init_args"]
    model["lora"] = {"r": 4, "export": "adapter" if stage == "dpo" else "merged"}
    data = {
        "train_path": str(HH_RLHF),
        "format": "hh_rlhf",
        "max_records": 48,
        "max_length": 96,
        "max_prompt_length": 64,
        "batch_size": 4,
    }
    if stage == "rm":
        config["model"]["class_path"] = "rlhf_lit.stages.RewardModelModule"
        model["normalize"] = "gain_bias"
        data.update(reference_path=str(TINYSTORIES), reference_format="paragraphs", reference_max_records=16)
    else:
        config["model"]["class_path"] = "rlhf_lit.stages.DPOModule"
    config["data"] = {"class_path": "rlhf_lit.data.PreferenceDataModule", "init_args": data}
    config["trainer"].update(strategy=strategy, devices=2)
    return config


def _assert_close(fsdp2: dict, ddp: dict, atol: float = ATOL) -> None:
    """fsdp2's tensors equal ddp's to float32 rounding (:data:`RTOL`, ``atol`` of each tensor's largest value)."""
    assert fsdp2.keys() == ddp.keys()
    for name, value in ddp.items():
        torch.testing.assert_close(fsdp2[name], value, rtol=RTOL, atol=atol * float(value.abs().max()), msg=name)


def _assert_close_and_moved(fsdp2: dict, ddp: dict, start: dict) -> None:
    """fsdp2's tensors equal ddp's, and training moved those named in ``start`` far beyond the tolerance."""
    _assert_close(fsdp2, ddp)
    moved = max(float((ddp[n] - start[n]).abs().max()) for n in start)
    assert moved > 1e-4, moved


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["dpo", "rm"])
def test_lora_under_fsdp2_trains_what_ddp_trains(stage, tmp_path):
    for strategy in ("ddp", "fsdp2"):
        _fit(tmp_path / strategy, _preference_config(tmp_path / strategy, stage, strategy))
    ddp, fsdp2 = tmp_path / "ddp" / "export", tmp_path / "fsdp2" / "export"
    if stage == "dpo":  # the adapter alone: loads with peft on its base (named by absolute path)
        from peft import AutoPeftModelForCausalLM

        assert type(AutoPeftModelForCausalLM.from_pretrained(fsdp2).get_base_model()).__name__ == "LlamaForCausalLM"
        config = json.loads((fsdp2 / "adapter_config.json").read_text())
        assert config["r"] == 4 and config["base_model_name_or_path"] == str(STORIES.resolve())
        adapters = {
            name: load_file(path / "adapter_model.safetensors") for name, path in (("ddp", ddp), ("fsdp2", fsdp2))
        }
        start = {n: torch.zeros_like(v) if "lora_B" in n else v for n, v in adapters["ddp"].items()}  # B starts at 0
        _assert_close_and_moved(adapters["fsdp2"], adapters["ddp"], start)
        return
    models = {
        name: AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
        for name, path in (("ddp", ddp), ("fsdp2", fsdp2))
    }
    for model in models.values():  # merged: plain transformers, the gain folded into the head
        assert not any("lora" in n for n in model.state_dict())
        assert model.config.rlhf_lit_reward_normalization["gain"] != 1.0
    norm = {name: m.config.rlhf_lit_reward_normalization for name, m in models.items()}
    assert norm["fsdp2"]["gain"] == pytest.approx(norm["ddp"]["gain"], rel=RTOL)
    assert norm["fsdp2"]["bias"] == pytest.approx(norm["ddp"]["bias"], rel=RTOL)
    start = AutoModelForCausalLM.from_pretrained(STORIES).state_dict()  # the trunk (model.*); the head was fresh
    start = {n: v for n, v in start.items() if n.startswith("model.")}
    _assert_close_and_moved(models["fsdp2"].state_dict(), models["ddp"].state_dict(), start)


def _kl_by_rollout(root) -> dict[int, float]:
    """``objective/kl`` of every rollout logged under ``root/logs`` (a resumed run logs in a new version)."""
    return {
        int(row["step"]): float(row["objective/kl"])
        for path in (root / "logs").rglob("metrics.csv")
        for row in csv.DictReader(path.open())
        if row.get("objective/kl")
    }


@pytest.mark.slow
def test_ppo_with_lora_under_fsdp2_resumes_to_the_ddp_run(tmp_path, stories_rm):
    # LoRA on the policy (its reference: the same sharded policy, adapters off) and on a separate
    # critic, gradient checkpointing on both; a constant schedule, so a resume may raise max_rollouts.
    # The embedding's adapter sits in the root unit, which a no-grad pass leaves gathered; with old
    # logprobs from sampling the reference pass follows generation, so peft freezes that adapter's
    # shards on entry and unfreezes the gathered copies on exit: unless adapter_disabled unfreezes
    # the shards too, the adapter stops training after the first minibatch.
    def config(root, strategy: str, rollouts: int) -> dict:
        model = {
            "lora": {"r": 4, "target_modules": ["q_proj", "v_proj", "down_proj", "embed_tokens"]},
            "critic_lora": {"r": 4},
            "memory": {"gradient_checkpointing": True},
        }
        config = ppo_config(root, STORIES, stories_rm, max_rollouts=rollouts, **model)
        config["model"]["init_args"]["ppo"]["old_logprobs"] = "sampling"
        config["model"]["init_args"]["optimizer"]["schedule"] = "constant"
        config["trainer"].update(strategy=strategy, devices=2)
        return config

    ddp, fsdp2 = tmp_path / "ddp", tmp_path / "fsdp2"
    _fit(ddp, config(ddp, "ddp", 2))
    _fit(fsdp2, config(fsdp2, "fsdp2", 1))  # one rollout, then resumed from its checkpoint for the second
    _fit(
        fsdp2,
        config(fsdp2, "fsdp2", 1),
        "--model.init_args.max_rollouts",
        "2",
        "--model.init_args.export_existing",
        "replace",
        "--ckpt_path",
        str(fsdp2 / "ckpt" / "last.ckpt"),
    )

    # The reference is the base: KL 0 before any update (to the rounding between the sampling pass's
    # logits and the reference's full pass), far from 0 once the adapters moved (a reference that
    # were the policy itself would stay at 0).
    kl = {name: _kl_by_rollout(root) for name, root in (("ddp", ddp), ("fsdp2", fsdp2))}
    assert abs(kl["ddp"][0]) < 1e-5 and abs(kl["fsdp2"][0]) < 1e-5
    assert abs(kl["ddp"][1]) > 1e-3
    # A mean of logprob differences: float32 rounding of the logprobs (measured 4.3e-6) in absolute terms.
    assert kl["fsdp2"][1] == pytest.approx(kl["ddp"][1], abs=1e-5)

    start = AutoModelForCausalLM.from_pretrained(STORIES).state_dict()
    exports = [AutoModelForCausalLM.from_pretrained(root / "export").state_dict() for root in (fsdp2, ddp)]
    _assert_close_and_moved(*exports, start)  # merged: plain transformers
    # The checkpoints: full weights (frozen base and adapters, policy and critic), optimizer states
    # over the trainable tensors only (policy adapters; critic adapters and head), in one layout.
    ckpts = [torch.load(root / "ckpt" / "last.ckpt", weights_only=True, map_location="cpu") for root in (fsdp2, ddp)]
    weights = [c["state_dict"] for c in ckpts]
    frozen = [n for n in weights[1] if "lora_" not in n and not n.endswith("score.weight")]
    assert all(torch.equal(weights[0][n], weights[1][n]) for n in frozen)  # the base weights never change
    # An adapter is a sum of small Adam steps (B starts at 0): the gradients' rounding shows at up to
    # 1.5e-5 of its largest value (measured; see the module docstring).
    _assert_close(weights[0], weights[1], atol=1e-4)
    trainable = [sum("lora_" in n for n in weights[1] if n.startswith(m)) for m in ("policy.", "critic.")]
    for ckpt in ckpts:
        assert [len(o["state"]) for o in ckpt["optimizer_states"]] == [trainable[0], trainable[1] + 1]  # + score

"""``frozen_modules`` through ``rlhf-lit fit``, as a user sets it in a config: a PPO run with the policy's top
block's MLP frozen exports a policy whose MLP is the SFT model's to the bit while its attention moved; a
name that matches no module is one ``rlhf-lit: error:`` line naming the option and the name, before any step."""

from __future__ import annotations

import torch
from cli_helpers import STORIES, TINYSTORIES, error_line, ppo_config, run_main, sft_config, write_yaml
from transformers import AutoModelForCausalLM


def test_a_ppo_run_keeps_the_policys_frozen_modules_as_they_were(tmp_path, stories_rm):
    config = ppo_config(
        tmp_path, STORIES, stories_rm, max_rollouts=2, trainable_layers=2, frozen_modules=["layers.4.mlp"]
    )
    config["model"]["init_args"]["optimizer"]["lr"] = 3.0e-3  # what trains moves visibly in 2 rollouts
    result = run_main("fit", "--config", str(write_yaml(tmp_path / "ppo.yaml", config)), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    sft = AutoModelForCausalLM.from_pretrained(STORIES, dtype=torch.float32).state_dict()
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "export", dtype=torch.float32).state_dict()
    mlp = [n for n in sft if n.startswith("model.layers.4.mlp.")]
    assert mlp and all(torch.equal(exported[n], sft[n]) for n in mlp)
    assert not torch.equal(
        exported["model.layers.4.self_attn.q_proj.weight"], sft["model.layers.4.self_attn.q_proj.weight"]
    )


def test_a_name_that_matches_no_module_is_one_error_before_any_step(tmp_path):
    config = sft_config(tmp_path, TINYSTORIES, model={"frozen_modules": ["layers.4.mpl"]})
    result = run_main("fit", "--config", str(write_yaml(tmp_path / "sft.yaml", config)), cwd=tmp_path)
    assert result.returncode != 0
    line = error_line(result)
    assert "frozen_modules: no module of LlamaForCausalLM is named 'layers.4.mpl'" in line, line
    assert "'layers.4.mlp'" in line  # an example of a name that would do
    assert not (tmp_path / "export").exists()

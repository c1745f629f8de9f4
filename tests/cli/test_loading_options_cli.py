"""The loading options of the stages (``dtype``, ``revision``, ``trust_remote_code``, ``attn_implementation``,
rlhf_lit/models/loading.py ``ModelLoading``) reach ``from_pretrained`` for every model a stage loads: a spy on
transformers' loaders records each load of a PPO run through ``rlhf-lit fit`` (policy, reference, reward
model, separate critic) and of the SFT, reward-model and DPO stages; a kernel transformers cannot load is one
``rlhf-lit: error:`` line naming the option."""

from __future__ import annotations

import importlib.util

import pytest
from cli_helpers import STORIES, TINYSTORIES, error_line, ppo_config, run_main, sft_config, write_yaml
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from rlhf_lit.stages import DPOModule, RewardModelModule, SFTModule

LOADERS = {"causal_lm": AutoModelForCausalLM, "reward": AutoModelForSequenceClassification}


@pytest.fixture
def loads(monkeypatch) -> list[dict]:
    """Every model load of the test: ``{"kind", "path", "kwargs", "attention"}``, ``attention`` the kernel the
    loaded model runs (its config's), in load order."""
    seen: list[dict] = []
    for kind, auto_class in LOADERS.items():
        original = auto_class.from_pretrained.__func__

        def spy(cls, path, *args, _kind=kind, _original=original, **kwargs):
            loaded = _original(cls, path, *args, **kwargs)
            model = loaded[0] if isinstance(loaded, tuple) else loaded  # output_loading_info=True
            attention = model.config._attn_implementation
            seen.append({"kind": _kind, "path": str(path), "kwargs": kwargs, "attention": attention})
            return loaded

        monkeypatch.setattr(auto_class, "from_pretrained", classmethod(spy))
    return seen


def test_every_model_of_a_ppo_run_is_loaded_with_the_stage_options(tmp_path, loads, stories_rm):
    options = {"revision": "main", "trust_remote_code": True, "attn_implementation": "eager"}
    config = ppo_config(tmp_path, STORIES, stories_rm, value_model=str(STORIES), max_rollouts=2, **options)
    result = run_main("fit", "--config", str(write_yaml(tmp_path / "ppo.yaml", config)), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    # policy, its frozen reference copy, the reward model, the separate critic (from value_model): in that order
    assert [(load["kind"], load["path"]) for load in loads] == [
        ("causal_lm", str(STORIES)),
        ("causal_lm", str(STORIES)),
        ("reward", stories_rm),
        ("reward", str(STORIES)),
    ]
    for load in loads:
        assert load["kwargs"]["attn_implementation"] == "eager", load
        assert load["attention"] == "eager", load  # transformers' default here would be sdpa
        assert load["kwargs"]["trust_remote_code"] is True, load
    # revision pins sft_model: the policy and its reference; the reward and value models are other repositories
    assert [load["kwargs"]["revision"] for load in loads] == ["main", "main", None, None]


def test_every_model_of_sft_reward_model_and_dpo_is_loaded_with_the_stage_options(loads):
    options = {"revision": "main", "trust_remote_code": True, "attn_implementation": "eager"}
    SFTModule(model=str(STORIES), **options)
    RewardModelModule(model=str(STORIES), **options)
    DPOModule(model=str(STORIES), **options)  # the policy and its frozen reference
    assert [load["kind"] for load in loads] == ["causal_lm", "reward", "causal_lm", "causal_lm"]
    for load in loads:
        assert {k: load["kwargs"][k] for k in options} == options, load
        assert load["attention"] == "eager", load


def test_without_the_option_transformers_chooses_the_kernel(loads):
    SFTModule(model=str(STORIES))
    (load,) = loads
    assert load["kwargs"]["attn_implementation"] is None and load["attention"] == "sdpa"


KERNELS = [
    pytest.param("no_such_kernel", "is not supported", id="unknown"),
    pytest.param(
        "flash_attention_2",
        "FlashAttention2",
        id="package-missing",
        marks=pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None, reason="flash-attn installed"),
    ),
]


@pytest.mark.parametrize("kernel, why", KERNELS)
def test_a_kernel_transformers_cannot_load_is_one_error_naming_the_option(tmp_path, kernel, why):
    config = sft_config(tmp_path, TINYSTORIES, model={"attn_implementation": kernel})
    result = run_main("fit", "--config", str(write_yaml(tmp_path / "sft.yaml", config)), cwd=tmp_path)
    assert result.returncode != 0
    line = error_line(result)
    assert f"attn_implementation {kernel!r}" in line and str(STORIES) in line and why in line, line
    assert "leave attn_implementation unset (null)" in line


def test_every_member_of_a_reward_model_ensemble_is_loaded_with_the_stage_options(tmp_path, loads):
    from transformers import AutoTokenizer

    from rlhf_lit.models import load_reward_model
    from rlhf_lit.models.reward_ensemble import RewardEnsemble
    from rlhf_lit.stages import PPOModule

    RewardEnsemble([load_reward_model(str(STORIES)) for _ in range(2)]).save_pretrained(tmp_path / "ensemble")
    AutoTokenizer.from_pretrained(STORIES).save_pretrained(tmp_path / "ensemble")
    loads.clear()  # the ensemble's making
    PPOModule(sft_model=str(STORIES), reward_model=str(tmp_path / "ensemble"), attn_implementation="eager")
    members = [str(tmp_path / "ensemble" / "members" / f"member_{m}") for m in (0, 1)]
    # policy, reference, each member, and the critic, which starts from member 0
    assert [load["path"] for load in loads] == [str(STORIES), str(STORIES), *members, members[0]]
    assert all(load["attention"] == "eager" for load in loads), loads

"""The shipped configs never train a policy on the prompts their reward model and DPO validate on.

Every config that trains on a prompt set (``PromptDataModule``: PPO and the critic-free estimators) is paired
with the reward-model and DPO configs of its recipe (the configs in its folder: the reward model its PPO stage
reads) that read the same data; an ``rlhf-lit iterate`` loop's labelled and held-out prompts are checked against
its PPO config. Each data module is built from its config and reads its splits as ``setup`` does
(:meth:`~rlhf_lit.data.base.TextDataModule.read_splits`); a record is known by where it sits (``Example.where``:
the file and line, or the hub dataset's split and row), so a prompt repeated in two records is not a clash but a
record in both sets is. A hub dataset is read from a stand-in holding the shipped HH-RLHF sample; HH transcripts
read as strings (no tokenizer), which holds out the same records as conversations would: the split draws records,
not examples.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from assets_paths import CONFIGS, HH_RLHF, ROOT
from hub_stand_in import fake_hub

from rlhf_lit.commands.iterate_config import read_config
from rlhf_lit.config_files import read_yaml_mapping
from rlhf_lit.data.prompt_source import config_data_module, hh_reading, read_prompt_examples

PROMPT_TRAINERS = ("PPOModule",)
"""The stages that train on a prompt set (the estimators GRPO, RLOO, ... are PPOModule's ``ppo.estimator``)."""
VALIDATORS = ("RewardModelModule", "DPOModule")
"""The stages whose validation prompts the prompt trainers must hold out."""


def _data(config: Path) -> dict:
    data = read_yaml_mapping(str(config)).get("data") or {}
    return data.get("init_args") or {}


def _stage(config: Path) -> str:
    model = read_yaml_mapping(str(config)).get("model") or {}
    return str(model.get("class_path", "")).rsplit(".", 1)[-1]


def _sources(config: Path) -> set[str]:
    """The sources a config's data module reads its training and validation examples from."""
    data = _data(config)
    return {data[key] for key in ("train_path", "val_path") if data.get(key)}


def _pairs() -> list[tuple[Path, Path]]:
    """(prompt trainer, validator) of one folder that read a source in common (an overlay without data is
    checked with the config it overlays)."""
    configs = sorted(CONFIGS.rglob("*.yaml"))
    trainers = [c for c in configs if _stage(c) in PROMPT_TRAINERS and _data(c).get("train_path")]
    validators = [c for c in configs if _stage(c) in VALIDATORS and _data(c).get("train_path")]
    return [
        (t, v) for t in trainers for v in validators if t.parent == v.parent and _data(t)["train_path"] in _sources(v)
    ]


PAIRS = _pairs()


def _hh_rows() -> list[dict]:
    with gzip.open(HH_RLHF, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _splits(config: Path) -> tuple[set[str], set[str]]:
    """The records (``where``) of the config's training and validation examples."""
    module = config_data_module(str(config))
    train, val, _ = module.read_splits(hh_reading(module.hh_render, None, "hh_render"))
    return {e.where for e in train}, {e.where for e in val}


def test_the_recipes_that_share_their_data_are_all_found():
    found = {(str(t.relative_to(CONFIGS)), str(v.relative_to(CONFIGS))) for t, v in PAIRS}
    assert {
        ("ppo.yaml", "reward_model.yaml"),
        ("ppo.yaml", "dpo.yaml"),
        ("classic_gpt2/ppo.yaml", "classic_gpt2/reward_model.yaml"),
        ("classic_gpt2/ppo.yaml", "classic_gpt2/dpo.yaml"),
        ("smollm2_hh/ppo.yaml", "smollm2_hh/reward_model.yaml"),
        ("smollm2_hh/ppo.yaml", "smollm2_hh/reward_model_debiased.yaml"),
        ("smollm2_hh/ppo.yaml", "smollm2_hh/dpo.yaml"),
        ("smollm2_hh/ppo_lora.yaml", "smollm2_hh/dpo.yaml"),
    } <= found


@pytest.mark.parametrize(
    "trainer, validator", PAIRS, ids=[f"{t.relative_to(CONFIGS)}-{v.relative_to(CONFIGS)}" for t, v in PAIRS]
)
def test_a_policy_never_trains_on_the_prompts_its_reward_model_or_dpo_validates_on(trainer, validator, monkeypatch):
    monkeypatch.chdir(ROOT)  # the configs name the assets relative to the checkout
    fake_hub(monkeypatch, {"train": _hh_rows()})  # Anthropic/hh-rlhf's train split, played by the shipped sample
    trained, _ = _splits(trainer)
    _, validated = _splits(validator)
    assert validated, f"{validator.relative_to(ROOT)} holds out nothing"
    clash = sorted(trained & validated)
    assert not clash, (
        f"{trainer.relative_to(ROOT)} trains on {len(clash)} of the {len(validated)} records "
        f"{validator.relative_to(ROOT)} validates on, e.g. {clash[:3]}"
    )


LOOPS = sorted(
    c
    for c in CONFIGS.rglob("*.yaml")
    if "iterations" in read_yaml_mapping(str(c)) and read_yaml_mapping(str(c)).get("policy", "ppo") == "ppo"
)
"""The ``rlhf-lit iterate`` configs whose policy is PPO with a config of its own prompts (a ``policy: bonbon``
loop trains on its labelled prompts alone, which never include the held-out ones)."""


def test_there_is_a_loop_config_to_check():
    assert LOOPS


@pytest.mark.parametrize("loop", LOOPS, ids=[str(c.relative_to(CONFIGS)) for c in LOOPS])
def test_an_iterate_loop_labels_and_holds_out_no_prompt_its_ppo_config_trains_on(loop, monkeypatch):
    monkeypatch.chdir(ROOT)
    config = read_config(str(loop))
    # what the loop reads (rlhf_lit.commands.iterate_command.read_loop_prompts): the held-out prompts, then
    # per_iteration fresh ones to label each iteration; the reward model validates on some of the labelled ones
    examples, _ = read_prompt_examples(config.prompts.source())
    used = examples[: config.prompts.held_out + config.iterations * config.prompts.per_iteration]
    trained, _ = _splits(Path(config.ppo.config))
    clash = sorted(trained & {e.where for e in used})
    assert not clash, f"{loop.relative_to(ROOT)} labels or holds out {len(clash)} records PPO trains on: {clash[:3]}"

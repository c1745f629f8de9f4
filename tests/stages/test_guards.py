"""Non-finite updates are skipped without touching the weights; remote code never runs unless asked."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from jsonargparse import ArgumentParser

from rlhf_lit.models import load_causal_lm
from rlhf_lit.stages import PPOModule, RewardModelModule, SFTModule
from rlhf_lit.stages.nonfinite import NonFiniteError
from rlhf_lit.stages.optim import OptimizerConfig


def test_sft_steps_with_a_nan_loss_change_nothing_and_stop_the_run(stories_path, helpers, tmp_path):
    torch.manual_seed(0)
    module = SFTModule(stories_path, optimizer=OptimizerConfig(lr=1e-2), max_skipped_updates=2)
    batch = helpers.sft_batch(module.tokenizer, [("Once upon", " a time."), ("Tom", " ran home.")])
    loss = module.loss
    poisoned = {"on": False}
    module.loss = lambda b: loss(b) * (float("nan") if poisoned["on"] else 1.0)
    trainer = helpers.cpu_trainer(tmp_path, max_steps=1)
    trainer.fit(module, datamodule=helpers.BatchListDataModule(train=[batch]))  # one clean step
    after_clean = {k: v.clone() for k, v in module.model.state_dict().items()}
    poisoned["on"] = True
    trainer = helpers.cpu_trainer(tmp_path / "poisoned", max_steps=3)
    with pytest.raises(
        NonFiniteError,
        match=r"2 updates in a row skipped .*non-finite gradients of the optimizer at step \d.*max_skipped_updates=2",
    ):
        trainer.fit(module, datamodule=helpers.BatchListDataModule(train=[batch] * 3))
    for key, value in module.model.state_dict().items():  # the skipped steps moved no weight
        assert torch.equal(value, after_clean[key]), key
    assert module.nonfinite.total == 2


def test_no_stage_trusts_remote_code_unless_the_config_says_so(stories_path, tmp_path):
    for stage in (SFTModule, RewardModelModule, PPOModule):  # the default a config gets, as the command line reads it
        parser = ArgumentParser()
        parser.add_class_arguments(stage, "model")
        assert parser.get_defaults().model.trust_remote_code is False
    # A model directory that asks for its own code: it is loaded with transformers' own class for its
    # model type, and the directory's code never runs.
    path = tmp_path / "custom"
    shutil.copytree(stories_path, path)
    config = json.loads((path / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "custom_code.Config", "AutoModelForCausalLM": "custom_code.Model"}
    (path / "config.json").write_text(json.dumps(config))
    ran = tmp_path / "code-ran"
    (path / "custom_code.py").write_text(f"open({str(ran)!r}, 'w').close()\n")
    model = load_causal_lm(str(path))
    assert type(model).__module__.startswith("transformers.models.llama")
    assert not ran.exists()

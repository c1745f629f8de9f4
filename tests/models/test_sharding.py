"""Single-process checks of the sharding helpers; the 2-process runs are in tests/ppo/test_strategies.py
(and, with LoRA, tests/cli/test_lora_fsdp_cli.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from assets_paths import STORIES260K
from lightning.pytorch.strategies import FSDPStrategy
from transformers import AutoModelForSequenceClassification

from rlhf_lit.models.scoring import position_ids_from_mask, token_scores
from rlhf_lit.models.sharding import is_sharded, shard_models
from rlhf_lit.stages.resume import check_loaded_keys

STORIES = str(STORIES260K)


@pytest.fixture(scope="module")
def rm():
    torch.manual_seed(0)
    return AutoModelForSequenceClassification.from_pretrained(STORIES, num_labels=1).eval()


def test_token_scores_read_through_the_forward_pass_equal_trunk_then_head(rm):
    ids = torch.tensor([[0, 0, 1, 45, 67], [1, 300, 22, 9, 2]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    hidden = rm.model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).last_hidden_state
    expected = (hidden @ rm.score.weight.T).squeeze(-1)  # (B, T): the head at every position
    assert torch.equal(token_scores(rm, ids, mask), expected)


def test_without_a_device_mesh_nothing_is_sharded(rm):
    module = SimpleNamespace(_device_mesh=None, _trainer=SimpleNamespace(strategy=object()))
    shard_models(module, {"rm": rm})
    assert not is_sharded(rm)


def test_lightning_fsdp1_is_refused_in_one_message_naming_fsdp(rm):
    fsdp1 = SimpleNamespace(_device_mesh=None, _trainer=SimpleNamespace(strategy=FSDPStrategy()))
    with pytest.raises(ValueError, match=r"FSDPStrategy \(FSDP1.*use --trainer.strategy fsdp"):
        shard_models(fsdp1, {"rm": rm})


def test_a_checkpoint_may_lack_the_frozen_models_only():
    frozen = ("ref_policy.", "reward_model.")
    check_loaded_keys(["ref_policy.w", "reward_model.b"], [], frozen, strict=True)
    check_loaded_keys(["policy.w"], ["x"], frozen, strict=False)
    with pytest.raises(RuntimeError, match=r"missing 1 weights \(policy.w\)"):
        check_loaded_keys(["policy.w", "ref_policy.w"], [], frozen, strict=True)
    with pytest.raises(RuntimeError, match=r"unexpected 1 weights \(critic.x\)"):
        check_loaded_keys([], ["critic.x"], frozen, strict=True)

"""The demo's frontier: PPO checkpoint policies (read by the library, :mod:`rlhf_lit.models.checkpoint_policy`),
its table, plot and ``frontier.json`` (the points themselves: tests/evaluation/test_score_kl_frontier.py)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from demo.frontier import export_checkpoint_policy, write_frontier
from rlhf_lit.callbacks import RolloutCheckpoint
from rlhf_lit.data import PromptDataModule
from rlhf_lit.evaluation.frontier import FrontierPoint, frontier_table
from rlhf_lit.models.checkpoint_policy import load_checkpoint_policy, policy_state_dict, rollout_checkpoints

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ppo"))
from ppo_helpers import STORIES, TINYSTORIES, tiny_module, tiny_trainer  # noqa: E402


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory):
    """Two PPO rollouts on stories260K with a weights-only checkpoint after each and an export at the end."""
    root = tmp_path_factory.mktemp("ppo")
    module = tiny_module(max_rollouts=2, export_dir=str(root / "export"))
    ckpt = RolloutCheckpoint(
        dirpath=str(root / "checkpoints"), every_n_rollouts=1, save_top_k=-1, save_weights_only=True
    )
    data = PromptDataModule(
        tokenizer=module.tokenizer, train_path=TINYSTORIES, format="paragraphs", max_records=16, batch_size=4, seed=3
    )
    tiny_trainer(root, enable_checkpointing=True, callbacks=[ckpt]).fit(module, data)
    return root


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_the_last_checkpoint_policy_equals_the_export(ppo_run):
    checkpoints = rollout_checkpoints(str(ppo_run / "checkpoints"))
    assert list(checkpoints) == [1, 2]
    exported = _weights(AutoModelForCausalLM.from_pretrained(ppo_run / "export"))
    loaded = _weights(load_checkpoint_policy(checkpoints[2], STORIES))
    assert loaded.keys() == exported.keys()
    for name, tensor in exported.items():
        assert torch.equal(loaded[name], tensor), name
    # The comparison can fail: the policy after rollout 1 and the SFT start both differ from the export.
    first = _weights(load_checkpoint_policy(checkpoints[1], STORIES))
    base = _weights(AutoModelForCausalLM.from_pretrained(STORIES))
    assert any(not torch.equal(first[k], exported[k]) for k in exported)
    assert any(not torch.equal(base[k], exported[k]) for k in exported)


def test_an_exported_checkpoint_policy_loads_with_its_tokenizer(ppo_run, tmp_path):
    from transformers import AutoTokenizer

    out = export_checkpoint_policy(rollout_checkpoints(str(ppo_run / "checkpoints"))[2], STORIES, str(tmp_path / "m"))
    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer("Once upon a time", return_tensors="pt").input_ids
    export = AutoModelForCausalLM.from_pretrained(ppo_run / "export")
    with torch.no_grad():
        assert torch.equal(model(ids).logits, export(ids).logits)


def test_policy_state_dict_strips_the_prefix_and_drops_other_modules():
    a, b, c = torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)
    state = {
        "policy.model.embed_tokens.weight": a,
        "policy.lm_head.weight": b,
        "critic.v_head.weight": c,
        "ref_policy.lm_head.weight": c,
    }
    assert policy_state_dict(state) == {"model.embed_tokens.weight": a, "lm_head.weight": b}
    with pytest.raises(KeyError, match="no weights under 'actor.'"):
        policy_state_dict(state, prefix="actor.")


def test_rollout_checkpoints_reads_rollout_files_only(tmp_path):
    for name in ("rollout=20.ckpt", "rollout=3.ckpt", "last.ckpt", ".rollout=30.ckpt.tmp", "rollout=4.ckpt.old"):
        (tmp_path / name).write_text("")
    assert rollout_checkpoints(str(tmp_path)) == {
        3: str(tmp_path / "rollout=3.ckpt"),
        20: str(tmp_path / "rollout=20.ckpt"),
    }
    assert rollout_checkpoints(str(tmp_path / "missing")) == {}


def test_frontier_table_and_plot(tmp_path):
    points = [
        FrontierPoint("SFT", "-", 0.0, 0.28, 0.03, 256),
        FrontierPoint("PPO", "rollout 10", 3.5, 0.5, 0.02, 256),
        FrontierPoint("PPO", "rollout 30", 6.9, 0.59, 0.02, 256),
        FrontierPoint("PPO, KL coef 0", "rollout 30", 43.0, 0.94, 0.005, 256),
        FrontierPoint("best-of-N", "N 4", math.log(4) - 0.75, 0.6, 0.01, 64, kl_analytic=True, note="M 64"),
    ]
    png, table = write_frontier(points, str(tmp_path))
    assert table[:2] == [
        "| method | setting | KL to SFT (nats) | judge score +- s.e. | n | note |",
        "|---|---|---|---|---|---|",
    ]
    assert table[3] == "| PPO | rollout 10 | 3.50 | 0.500 +- 0.020 | 256 |  |"
    assert table[6] == "| best-of-N | N 4 | 0.64 (analytic) | 0.600 +- 0.010 | 64 | M 64 |"
    assert table == frontier_table(points)
    assert Path(png).name == "frontier.png" and Path(png).stat().st_size > 1000
    saved = json.loads((tmp_path / "frontier.json").read_text())
    assert [p["method"] for p in saved] == ["SFT", "PPO", "PPO", "PPO, KL coef 0", "best-of-N"]
    assert list(saved[1]) == ["method", "setting", "kl", "judge", "judge_se", "n", "kl_analytic", "note"]
    assert (saved[1]["judge"], saved[1]["judge_se"]) == (0.5, 0.02)


def test_the_loader_reads_a_checkpoint_that_rlhf_lit_fit_wrote(offline_chain):
    # The session's SFT -> RM -> PPO chain (tests/offline_chain.py): its PPO run's Lightning checkpoint,
    # written by `rlhf-lit fit` at the end of the run, holds the policy that run exported.
    (checkpoint,) = offline_chain.checkpoints("ppo")
    sft = str(offline_chain.export("sft"))
    exported = _weights(AutoModelForCausalLM.from_pretrained(offline_chain.export("ppo")))
    loaded = _weights(load_checkpoint_policy(str(checkpoint), sft))
    assert loaded.keys() == exported.keys()
    for name, tensor in exported.items():
        assert torch.equal(loaded[name], tensor), name
    # The comparison can fail: PPO moved the policy away from the SFT model it was loaded over.
    base = _weights(AutoModelForCausalLM.from_pretrained(sft))
    assert any(not torch.equal(base[k], exported[k]) for k in exported)

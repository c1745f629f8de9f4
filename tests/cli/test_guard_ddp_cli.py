"""The over-optimisation guard under ddp (two processes over gloo): every rank takes the same
decision, from the metrics averaged over ranks and rank 0's held-out evaluation (broadcast), so a
``stop`` ends both ranks after the same rollout and the run exports as usual."""

from __future__ import annotations

import pytest
import torch
from cli_helpers import STORIES, ppo_config, rlhf_lit_forked, write_yaml
from guard_helpers import guard, guard_lines, logged_metrics


@pytest.mark.slow
def test_under_ddp_stop_ends_both_ranks_after_the_same_rollout(tmp_path, stories_rm):
    config = ppo_config(tmp_path, STORIES, stories_rm, max_rollouts=6)
    config["trainer"].update(strategy="ddp", devices=2)
    config["trainer"]["callbacks"].append(
        guard(
            kl={"action": "stop", "ceiling": -1.0, "patience": 2},  # holds after every rollout: stops after rollout 2
            held_out={
                "prompts": ["Once upon a time", "The little dog"],
                "every_n_rollouts": 1,
                "judge": "rlhf_lit.evaluation.judges:vader",
            },
            proxy_gold={"action": "warn", "window": 3},
        )
    )
    result = rlhf_lit_forked("fit", "--config", str(write_yaml(tmp_path / "ppo.yaml", config)), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert guard_lines(result.stderr) == [("kl", 2, "stop")]  # rank 0 says it, once
    metrics = logged_metrics(tmp_path)
    assert sorted(metrics["objective/kl"]) == [0, 1] and sorted(metrics["guard/held_out/judge"]) == [0, 1]
    assert (tmp_path / "export" / "model.safetensors").is_file()
    last = torch.load(tmp_path / "ckpt" / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["ppo"]["rollout_index"] == 2
    assert last["callbacks"]["OverOptimisationGuard"]["stopped_at"] == 2

"""The over-optimisation guard in real ``rlhf-lit fit`` PPO runs: ``stop`` ends the run after the
rollout its rule trips at and the run exports as usual; ``keep_best`` exports the policy of the best
rollout, tensor for tensor that rollout's checkpointed policy; a run killed after a rollout and
resumed from that rollout's checkpoint ends with the guard's state and the export of the run that
was never killed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cli_helpers import STORIES, error_line, ppo_config, rlhf_lit_forked, run_main, write_yaml
from guard_helpers import guard, guard_lines, logged_metrics
from safetensors.torch import load_file

ROLLOUTS = 6

KEEP_BEST = guard(
    kl={"action": "keep_best", "ceiling": -1.0},  # the KL per response is always above -1: fires after rollout 1
    keep_best={"metric": "objective/scores"},
    held_out={
        "prompts": ["Once upon a time", "The little dog"],
        "every_n_rollouts": 2,
        "judge": "rlhf_lit.evaluation.judges:vader",
    },
    proxy_gold={"action": "warn", "window": 3},
    length={"action": "warn", "baseline": 2, "window": 2},
    distinct={"action": "warn", "baseline": 2, "window": 2},
    objective={"action": "warn", "window": 3},
)


def _config(root: Path, rm: str, guard_callback: dict, rollouts: int = ROLLOUTS) -> Path:
    config = ppo_config(root, STORIES, rm, max_rollouts=rollouts)
    config["trainer"]["callbacks"][0]["init_args"]["save_top_k"] = -1  # every rollout's checkpoint kept
    config["trainer"]["callbacks"].append(guard_callback)
    return write_yaml(root / "ppo.yaml", config)


def _guard_state(checkpoint: Path) -> dict:
    return torch.load(checkpoint, map_location="cpu", weights_only=True)["callbacks"]["OverOptimisationGuard"]


def test_stop_ends_the_run_after_the_rollout_its_rule_trips_and_exports(tmp_path, stories_rm):
    # always above a ceiling of -1: the rule holds after every rollout, patience 3 -> stops after rollout 3
    config = _config(tmp_path, stories_rm, guard(kl={"action": "stop", "ceiling": -1.0, "patience": 3}), rollouts=8)
    result = rlhf_lit_forked("fit", "--config", str(config), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert guard_lines(result.stderr) == [("kl", 3, "stop")]
    assert "(the run ends after this rollout and exports as usual)" in result.stderr
    metrics = logged_metrics(tmp_path)
    assert sorted(metrics["objective/kl"]) == [0, 1, 2]  # three rollouts ran, of eight
    assert metrics["guard/kl/acted"] == {0: 0.0, 1: 0.0, 2: 1.0}
    assert {"model.safetensors", "rlhf_lit_export.json"} <= {p.name for p in (tmp_path / "export").iterdir()}
    state = _guard_state(tmp_path / "ckpt" / "last.ckpt")
    assert state["stopped_at"] == 3 and state["rollouts"] == 3


@pytest.fixture(scope="module")
def guarded(tmp_path_factory, stories_rm) -> tuple[Path, str]:
    """A run with ``keep_best`` (by the rollout's RM score) and every other signal warning; its stderr."""
    root = tmp_path_factory.mktemp("guarded")
    result = rlhf_lit_forked("fit", "--config", str(_config(root, stories_rm, KEEP_BEST)), cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    return root, result.stderr


def _policy(checkpoint: Path) -> dict[str, torch.Tensor]:
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    return {k.removeprefix("policy."): v for k, v in state.items() if k.startswith("policy.")}


def test_keep_best_exports_the_policy_of_the_best_rollout(guarded):
    root, stderr = guarded
    assert ("kl", 1, "keep_best") in guard_lines(stderr)
    scores = logged_metrics(root)["objective/scores"]  # rollout i was sampled by the policy after i rollouts
    best = max(range(ROLLOUTS), key=lambda i: (scores[i], -i))
    assert 0 < best < ROLLOUTS - 1, scores  # a run where the best is neither the start nor the last
    assert (
        f"exporting the policy after rollout {best} (the best: objective/scores = {scores[best]:.6g}), "
        f"not the last (after rollout {ROLLOUTS})"
    ) in stderr
    exported = load_file(root / "export" / "model.safetensors")
    kept, last = _policy(root / "ckpt" / f"rollout={best}.ckpt"), _policy(root / "ckpt" / f"rollout={ROLLOUTS}.ckpt")
    assert exported and exported.keys() <= kept.keys()
    assert all(torch.equal(tensor, kept[name]) for name, tensor in exported.items())
    assert not all(torch.equal(tensor, last[name]) for name, tensor in exported.items())
    metrics = logged_metrics(root)
    assert sorted(metrics["guard/held_out/judge"]) == [1, 3, 5]  # after rollouts 2, 4, 6
    assert metrics["guard/best/rollout"][ROLLOUTS - 1] == best


def test_the_guard_resumes_exactly_after_a_kill(guarded, tmp_path, stories_rm):
    """A run killed after rollout 3 resumes from the checkpoint that rollout wrote (here the guarded
    run's own ``rollout=3.ckpt``, copied) and ends as the run that was never killed."""
    straight, _ = guarded
    config = _config(tmp_path, stories_rm, KEEP_BEST)
    checkpoint = tmp_path / "killed-after-3.ckpt"
    checkpoint.write_bytes((straight / "ckpt" / "rollout=3.ckpt").read_bytes())
    assert _guard_state(checkpoint)["rollouts"] == 3
    result = run_main("fit", "--config", str(config), "--ckpt_path", str(checkpoint), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    resumed, whole = _guard_state(tmp_path / "ckpt" / "last.ckpt"), _guard_state(straight / "ckpt" / "last.ckpt")
    kept, whole_kept = resumed.pop("best_weights"), whole.pop("best_weights")
    assert resumed == whole and resumed["rollouts"] == ROLLOUTS
    assert kept.keys() == whole_kept.keys() and all(torch.equal(v, whole_kept[k]) for k, v in kept.items())
    logged, whole_logged = logged_metrics(tmp_path), logged_metrics(straight)
    guard_keys = [k for k in whole_logged if k.startswith("guard/")]
    assert guard_keys and all({s: v for s, v in whole_logged[k].items() if s >= 3} == logged[k] for k in guard_keys)
    exported = (tmp_path / "export" / "model.safetensors").read_bytes()
    assert exported == (straight / "export" / "model.safetensors").read_bytes()


def test_a_setting_no_run_can_use_is_one_error_line(tmp_path, stories_rm):
    config = _config(tmp_path, stories_rm, guard(kl={"action": "warn"}))
    result = run_main("fit", "--config", str(config), cwd=tmp_path)
    assert result.returncode != 0
    assert "set kl.ceiling or kl.max_rate (or both) with kl.action" in error_line(result)

"""bench/chat_ppo_variants.py: a variant's margin over DPO is its curve (the instruction model at KL 0, then
its checkpoints by rollout) read at DPO's KL, minus DPO's judge mean, worked by hand; a folder that is not
a finished demo run is refused by name; ``--seed`` seeds the variant's fit as the study seeded its run."""

from __future__ import annotations

import sys

import pytest
from assets_paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import chat_ppo_variants  # noqa: E402


def test_margin_is_the_curve_at_dpos_kl_minus_dpo():
    base = {"judge_mean": 0.1}
    # listed out of order: the curve follows the rollouts, 4 then 8
    measured = {8: {"kl_mean": 2.0, "judge_mean": 0.5}, 4: {"kl_mean": 1.0, "judge_mean": 0.3}}
    dpo = {
        "a": {"kl_mean": 0.5, "judge_mean": 0.25},  # curve at 0.5: 0.1 + 0.5 * 0.2 = 0.2
        "b": {"kl_mean": 1.5, "judge_mean": 0.3},  # curve at 1.5: 0.4
        "c": {"kl_mean": 3.0, "judge_mean": 0.3},  # beyond the curve's last KL
    }
    margins = chat_ppo_variants.against_dpo(base, measured, dpo)
    assert margins["a"] == pytest.approx(-0.05)
    assert margins["b"] == pytest.approx(0.1)
    assert margins["c"] is None


def test_a_folder_without_a_finished_run_is_refused_by_name(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "ppo.jsonl").write_text("")
    with pytest.raises(SystemExit, match=r"--demo .*: no data/eval.jsonl \(not a finished `make demo-chat` folder\)"):
        chat_ppo_variants.finished_run(tmp_path)


@pytest.mark.parametrize("seed", [None, 2])
def test_a_variant_is_fitted_with_the_runs_seed(tmp_path, monkeypatch, seed):
    """The fit command carries ``--seed_everything N`` and PPO's ``rollout_seed N`` for ``--seed N`` (a
    ``demo.chat_seeds`` run's seed), neither without it (the configs' own), and the variant's options last."""
    commands = []
    monkeypatch.setattr(chat_ppo_variants.subprocess, "run", lambda cmd, **kwargs: commands.append(cmd))
    ppo_prompts = tmp_path / "ppo.jsonl"
    ppo_prompts.write_text("")
    run = {"ppo_prompts": ppo_prompts, "reward_model": tmp_path / "rm", "precision": "32-true"}
    options = ["--model.init_args.kl.init_coef", "0.2"]
    chat_ppo_variants.fit_variant("/m", run, options, tmp_path / "variant", 8, seed)
    (cmd,) = commands
    pairs = dict(zip(cmd, cmd[1:]))
    if seed is None:
        assert "--seed_everything" not in cmd and "--model.init_args.rollout_seed" not in cmd
    else:
        assert pairs["--seed_everything"] == str(seed) and pairs["--model.init_args.rollout_seed"] == str(seed)
    assert pairs["--model.init_args.reward_model"] == str((tmp_path / "rm").absolute())
    assert cmd[-2:] == options

"""``--seed_everything`` seeds the whole run: with ``rollout_seed`` and ``data.seed`` unset they follow it."""

from __future__ import annotations

import hashlib

import torch
from cli_helpers import STORIES, error_line, ppo_config, rlhf_lit_forked, run_main, unseeded, write_yaml


def _unseeded_config(root, rm) -> dict:
    """A critic-free (GRPO) PPO run of one rollout whose only seed is ``seed_everything``."""
    return unseeded(
        ppo_config(
            root,
            STORIES,
            rm,
            max_rollouts=1,
            optimizer={"lr": 3.0e-4, "eps": 1.0e-5},
            ppo={"epochs": 1, "minibatch_size": 4, "estimator": "grpo"},
            sampling={"max_new_tokens": 8, "temperature": 1.0, "samples_per_prompt": 2},
        )
    )


def test_seed_everything_changes_the_run_and_the_same_seed_repeats_it(tmp_path, stories_rm):
    exports, checkpoints = {}, {}
    for name, seed in (("a", "11"), ("b", "12"), ("a_again", "11")):
        root = tmp_path / name
        write_yaml(root / "ppo.yaml", _unseeded_config(root, stories_rm))
        result = rlhf_lit_forked("fit", "--config", "ppo.yaml", "--seed_everything", seed, cwd=root)
        assert result.returncode == 0, result.stderr[-3000:]
        exports[name] = hashlib.sha256((root / "export" / "model.safetensors").read_bytes()).hexdigest()
        checkpoints[name] = torch.load(root / "ckpt" / "last.ckpt", map_location="cpu", weights_only=True)
    assert exports["a"] != exports["b"]  # sampled responses and prompts (and so the update) differ
    assert exports["a"] == exports["a_again"]
    # The prompt order followed the run seed (the sampler's permutation is seeded with it).
    assert [checkpoints[n]["PromptDataModule"]["sampler"]["seed"] for n in ("a", "b")] == [11, 12]

    # A resume under another run seed would sample and shuffle with other seeds: refused.
    root = tmp_path / "a"
    resumed = run_main(
        "fit",
        "--config",
        "ppo.yaml",
        "--seed_everything",
        "12",
        "--ckpt_path",
        str(root / "ckpt" / "last.ckpt"),
        "--model.init_args.export_existing",
        "replace",
        cwd=root,
    )
    assert resumed.returncode == 1
    assert error_line(resumed).startswith("rlhf-lit: error: cannot resume: the configuration differs")
    assert "  seed_everything (model.rollout_seed and data.seed follow it): checkpoint 11, now 12\n" in resumed.stderr

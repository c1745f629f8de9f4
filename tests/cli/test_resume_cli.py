"""Resume through the command line, as the README says: killed mid-rollout, resumed, identical to a straight run.

Also: a resume whose configuration differs where it would break the run is refused with every
difference listed, and a safe change (more rollouts) is accepted; a checkpoint without optimizer
states is refused.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import cli_forked
import pytest
import torch
from cli_helpers import (
    STORIES,
    TINYSTORIES,
    error_line,
    failure_tail,
    ppo_config,
    rlhf_lit_forked,
    run_main,
    sft_config,
    unseeded,
    write_yaml,
)

ROLLOUTS = 6
CONSTANT_LR = {"lr": 3.0e-4, "eps": 1.0e-5}  # a constant schedule: max_rollouts may grow on resume


def _load(path):
    """A checkpoint, on the CPU, tensors only."""
    return torch.load(path, map_location="cpu", weights_only=True)


def _as_lists(groups: list[dict]) -> list[dict]:
    """Optimizer param groups with tuples as lists (for comparing a sharded save with a plain one)."""
    return [{k: list(v) if isinstance(v, tuple) else v for k, v in group.items()} for group in groups]


def _assert_same_state(a: dict, b: dict, rollouts: int = ROLLOUTS, optimizers: int = 2) -> None:
    """Two checkpoints hold the same run: rollout count, KL controller, weights, optimizer and LR states."""
    assert a["ppo"]["rollout_index"] == b["ppo"]["rollout_index"] == rollouts
    assert a["ppo"]["kl_controller"] == b["ppo"]["kl_controller"]
    assert a["global_step"] == b["global_step"]
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for key in a["state_dict"]:
        assert torch.equal(a["state_dict"][key], b["state_dict"][key]), key
    assert len(a["optimizer_states"]) == len(b["optimizer_states"]) == optimizers
    for opt_a, opt_b in zip(a["optimizer_states"], b["optimizer_states"]):
        # (betas come back as a list from torch's distributed set_optimizer_state_dict: same values)
        assert _as_lists(opt_a["param_groups"]) == _as_lists(opt_b["param_groups"])
        assert opt_a["state"].keys() == opt_b["state"].keys()
        for index in opt_a["state"]:
            for name, value in opt_a["state"][index].items():
                assert torch.equal(torch.as_tensor(value), torch.as_tensor(opt_b["state"][index][name])), (index, name)
    assert a["lr_schedulers"] == b["lr_schedulers"]


def _fit(strategy: str | None, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``rlhf-lit fit <args>``: in a process of its own under a strategy (ddp and fsdp2 need one: a launcher
    that re-runs the command, a process group), through main() in this process without one."""
    return rlhf_lit_forked("fit", *args, cwd=cwd) if strategy else run_main("fit", *args, cwd=cwd)


def test_killed_mid_rollout_and_resumed_with_the_readme_command_equals_a_straight_run(tmp_path, stories_rm):
    """One process. Two under fsdp2: killed on one node and resumed on two in test_multinode_cli.py;
    under ddp: stopped by SIGTERM in test_preemption_cli.py."""
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    for root in (straight, killed):
        config = ppo_config(
            root, STORIES, stories_rm, max_rollouts=ROLLOUTS, sampling={"max_new_tokens": 24, "temperature": 1.0}
        )
        write_yaml(root / "ppo.yaml", config)
    done = run_main("fit", "--config", str(straight / "ppo.yaml"), cwd=straight)
    assert done.returncode == 0, failure_tail(done.stderr)
    assert len(list((straight / "logs").rglob("metrics.csv"))) == 1  # one log run

    # Its own session, killed with SIGKILL: no handler runs.
    proc = cli_forked.start(
        ["fit", "--config", str(killed / "ppo.yaml")], cwd=killed, stdout=killed / "output.txt", new_session=True
    )
    deadline = time.monotonic() + 300
    third, last = killed / "ckpt" / "rollout=3.ckpt", killed / "ckpt" / "last.ckpt"
    # last.ckpt is replaced (atomically) after rollout=3.ckpt is written; rollout 4 starts then.
    while not (third.exists() and last.exists() and last.stat().st_mtime_ns >= third.stat().st_mtime_ns):
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before its third checkpoint"
        time.sleep(0.01)
    time.sleep(0.05)  # into rollout 4 (a rollout takes ~1 s here)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed / "ckpt" / "rollout=4.ckpt").exists(), "killed too late: rollout 4 had finished"
    assert _load(killed / "ckpt" / "last.ckpt")["ppo"]["rollout_index"] == 3

    # The README's resume command.
    resumed = run_main(
        "fit", "--config", str(killed / "ppo.yaml"), "--ckpt_path", str(killed / "ckpt" / "last.ckpt"), cwd=killed
    )
    assert resumed.returncode == 0, failure_tail(resumed.stderr)
    assert "exported PPO policy to" in resumed.stdout
    _assert_same_state(_load(straight / "ckpt" / "last.ckpt"), _load(killed / "ckpt" / "last.ckpt"))
    exported = [p.name for p in (killed / "export").iterdir()]
    assert "model.safetensors" in exported and "rlhf_lit_export.json" in exported


@pytest.mark.slow
def test_a_checkpoint_resumes_under_another_strategy_exactly(tmp_path, stories_rm):
    """A single-process checkpoint continues under fsdp2, an fsdp2 one in a single process: both
    end where a straight single-process run ends (one process each: the world size must match)."""
    finals = {}
    for name, first, then in (("straight", None, None), ("to_fsdp2", None, "fsdp2"), ("from_fsdp2", "fsdp2", None)):
        root = tmp_path / name
        rollouts = 2 if first is None and then is None and name == "straight" else 1
        config = ppo_config(root, STORIES, stories_rm, max_rollouts=rollouts, optimizer=CONSTANT_LR)
        if first:
            config["trainer"]["strategy"] = first
        write_yaml(root / "first.yaml", config)
        result = _fit(first, "--config", str(root / "first.yaml"), cwd=root)
        assert result.returncode == 0, result.stderr[-3000:]
        if name != "straight":
            config = ppo_config(
                root, STORIES, stories_rm, max_rollouts=2, optimizer=CONSTANT_LR, export_existing="replace"
            )
            if then:
                config["trainer"]["strategy"] = then
            write_yaml(root / "then.yaml", config)
            result = _fit(
                then, "--config", str(root / "then.yaml"), "--ckpt_path", str(root / "ckpt" / "last.ckpt"), cwd=root
            )
            assert result.returncode == 0, result.stderr[-3000:]
        finals[name] = _load(root / "ckpt" / "last.ckpt")
    _assert_same_state(finals["straight"], finals["to_fsdp2"], rollouts=2)
    _assert_same_state(finals["straight"], finals["from_fsdp2"], rollouts=2)


def test_grpo_with_several_samples_per_prompt_resumes_exactly(tmp_path, stories_rm):
    """k = 2 samples per prompt, no critic (one optimizer): 1 rollout + resume = 2 straight rollouts,
    the data position counted in prompts, not rows; sampling, shuffles and prompt order seeded by
    ``seed_everything`` alone (``rollout_seed`` and ``data.seed`` unset)."""
    finals = {}
    for name in ("straight", "resumed"):
        root = tmp_path / name
        grpo = {
            "optimizer": CONSTANT_LR,
            "ppo": {"epochs": 2, "minibatch_size": 4, "estimator": "grpo"},
            "sampling": {"max_new_tokens": 12, "temperature": 1.0, "samples_per_prompt": 2},
        }
        config = unseeded(ppo_config(root, STORIES, stories_rm, max_rollouts=2 if name == "straight" else 1, **grpo))
        write_yaml(root / "first.yaml", config)
        result = run_main("fit", "--config", str(root / "first.yaml"), cwd=root)
        assert result.returncode == 0, result.stderr[-3000:]
        if name == "resumed":
            config = unseeded(ppo_config(root, STORIES, stories_rm, max_rollouts=2, export_existing="replace", **grpo))
            write_yaml(root / "then.yaml", config)
            result = run_main(
                "fit", "--config", str(root / "then.yaml"), "--ckpt_path", str(root / "ckpt" / "last.ckpt"), cwd=root
            )
            assert result.returncode == 0, result.stderr[-3000:]
        finals[name] = _load(root / "ckpt" / "last.ckpt")
    _assert_same_state(finals["straight"], finals["resumed"], rollouts=2, optimizers=1)
    assert not any(k.startswith("critic.") for k in finals["straight"]["state_dict"])
    # The data position (Lightning stores the data module's state under its class name) is the same.
    assert finals["resumed"]["PromptDataModule"] == finals["straight"]["PromptDataModule"]
    assert finals["straight"]["PromptDataModule"]["sampler"]["consumed"] == 2 * 4  # prompts, not 2 x 8 rows


@pytest.fixture(scope="module")
def finished_config(tmp_path_factory, stories_rm):
    """The folder of :func:`finished_run` with its ``ppo.yaml`` (2 rollouts, constant LR), not yet run."""
    root = tmp_path_factory.mktemp("finished")
    write_yaml(root / "ppo.yaml", ppo_config(root, STORIES, stories_rm, max_rollouts=2, optimizer=CONSTANT_LR))
    return root


@pytest.fixture(scope="module")
def finished_run(finished_config):
    """A 2-rollout PPO run whose last.ckpt later runs try to resume."""
    root = finished_config
    result = run_main("fit", "--config", str(root / "ppo.yaml"), cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    return root


def test_resume_with_a_changed_model_or_batch_is_refused_listing_every_difference(finished_run, stories_rm, tmp_path):
    # A different SFT model (the RM's directory), batch size, KL target and precision; more rollouts,
    # which is refused here because the linear schedule's length is max_rollouts.
    config = ppo_config(finished_run, stories_rm, stories_rm, max_rollouts=3, export_existing="replace")
    config["data"]["init_args"]["batch_size"] = 8
    config["model"]["init_args"]["kl"]["target"] = 3.0
    config["trainer"]["precision"] = "bf16-mixed"
    write_yaml(tmp_path / "changed.yaml", config)
    before = _load(finished_run / "ckpt" / "last.ckpt")
    result = run_main(
        "fit",
        "--config",
        str(tmp_path / "changed.yaml"),
        "--ckpt_path",
        str(finished_run / "ckpt" / "last.ckpt"),
        cwd=tmp_path,
    )
    assert result.returncode == 1
    assert error_line(result).startswith("rlhf-lit: error: cannot resume: the configuration differs")
    for line in (
        f"model.sft_model: checkpoint '{STORIES}', now '{stories_rm}'",
        "model.kl.target: checkpoint 1.0, now 3.0",
        "data.batch_size: checkpoint 4, now 8",
        "model.max_rollouts: checkpoint 2, now 3",
        "model.optimizer.schedule: checkpoint 'constant', now 'linear'",
        "trainer.precision: checkpoint '32-true', now 'bf16-mixed'",
    ):
        assert line in result.stderr, result.stderr[-2000:]
    # Nothing was trained or written: the checkpoint is as it was.
    assert _load(finished_run / "ckpt" / "last.ckpt")["global_step"] == before["global_step"]


def test_a_checkpoint_of_another_stage_is_refused_in_one_line_naming_both(finished_run, tmp_path):
    # Every setting of two stages differs: the settings check listed them all without saying why.
    data = tmp_path / "paragraphs.txt"
    data.write_text(TINYSTORIES.read_text(encoding="utf-8")[:4000], encoding="utf-8")
    write_yaml(tmp_path / "sft.yaml", sft_config(tmp_path, data, max_steps=1))
    checkpoint = finished_run / "ckpt" / "last.ckpt"
    result = run_main("fit", "--config", "sft.yaml", "--ckpt_path", str(checkpoint), cwd=tmp_path)
    assert result.returncode == 1
    assert error_line(result) == (
        "rlhf-lit: error: cannot resume: the checkpoint is of a PPOModule run (rlhf_lit.stages.PPOModule) and this "
        "run fits SFTModule; give --ckpt_path a checkpoint of a SFTModule run, or start without --ckpt_path"
    )
    assert "model.sft_model" not in result.stderr and not list(tmp_path.glob("**/*.ckpt"))


def test_resume_with_more_rollouts_continues(finished_run, stories_rm, tmp_path):
    config = ppo_config(
        finished_run, STORIES, stories_rm, max_rollouts=3, export_dir=str(tmp_path / "export3"), optimizer=CONSTANT_LR
    )
    config["trainer"]["callbacks"][0]["init_args"]["dirpath"] = str(tmp_path / "ckpt")
    write_yaml(tmp_path / "more.yaml", config)
    result = run_main(
        "fit",
        "--config",
        str(tmp_path / "more.yaml"),
        "--ckpt_path",
        str(finished_run / "ckpt" / "last.ckpt"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming with model.max_rollouts changed: 2 -> 3" in result.stderr
    assert _load(tmp_path / "ckpt" / "last.ckpt")["ppo"]["rollout_index"] == 3


def test_a_checkpoint_without_optimizer_states_is_refused_in_one_line(finished_run, tmp_path):
    # What PPO saves after fit (its optimizer states released) or Lightning's weights_only writes.
    checkpoint = _load(finished_run / "ckpt" / "last.ckpt")
    assert checkpoint["optimizer_states"][0]["state"]  # last.ckpt was written before the release
    del checkpoint["optimizer_states"]
    torch.save(checkpoint, tmp_path / "weights.ckpt")
    result = run_main(
        "fit",
        "--config",
        str(finished_run / "ppo.yaml"),
        "--ckpt_path",
        str(tmp_path / "weights.ckpt"),
        "--model.init_args.export_dir",
        str(tmp_path / "export"),
        cwd=tmp_path,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert error_line(result) == (
        "rlhf-lit: error: cannot resume: the checkpoint holds no optimizer states (written with weights_only, or "
        "saved after fit ended, when rlhf-lit had released them); resume from a checkpoint written during fit "
        "(last.ckpt), or load its weights with load_from_checkpoint and start a new run"
    )


def test_a_remote_checkpoint_is_refused(finished_config, tmp_path):
    # Refused while the arguments are parsed: the run's config is enough, the run itself is not needed.
    result = run_main(
        "fit", "--config", str(finished_config / "ppo.yaml"), "--ckpt_path", "https://example.com/x.ckpt", cwd=tmp_path
    )
    assert result.returncode == 1
    assert "remote checkpoints are not loaded" in error_line(result)


def test_an_sft_resume_with_other_trainer_settings_is_refused_and_an_unchanged_one_continues(tmp_path):
    """Precision, gradient accumulation and (with a decaying schedule) max_steps change what the
    resumed steps compute: refused, each named with both values; the same settings resume."""
    data = tmp_path / "paragraphs.txt"
    data.write_text(TINYSTORIES.read_text(encoding="utf-8")[:20000], encoding="utf-8")
    config = sft_config(tmp_path, data, max_steps=4, model={"optimizer": {"lr": 1.0e-3, "schedule": "linear"}})
    config["trainer"]["callbacks"][0]["init_args"]["save_top_k"] = -1  # keep the step-2 checkpoint
    write_yaml(tmp_path / "sft.yaml", config)
    first = run_main("fit", "--config", "sft.yaml", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    step2 = next((tmp_path / "ckpt").glob("*step=2.ckpt"))
    assert _load(step2)["run_facts"]["trainer.precision"] == "32-true"

    changed = rlhf_lit_forked(
        "fit",
        "--config",
        "sft.yaml",
        "--ckpt_path",
        str(step2),
        "--trainer.precision",
        "bf16-mixed",
        "--trainer.accumulate_grad_batches",
        "2",
        "--trainer.max_steps",
        "6",
        "--model.init_args.export_existing",
        "replace",
        cwd=tmp_path,
    )
    assert changed.returncode == 1
    assert error_line(changed).startswith("rlhf-lit: error: cannot resume: the configuration differs")
    differences = [line.strip() for line in changed.stderr.splitlines() if line.startswith("  ")]
    assert differences == [
        "trainer.accumulate_grad_batches: checkpoint 1, now 2",
        "trainer.max_steps: checkpoint 4, now 6",
        "trainer.precision: checkpoint '32-true', now 'bf16-mixed'",
    ]

    same = run_main(
        "fit",
        "--config",
        "sft.yaml",
        "--ckpt_path",
        str(step2),
        "--model.init_args.export_existing",
        "replace",
        cwd=tmp_path,
    )
    assert same.returncode == 0, same.stderr[-3000:]
    assert _load(tmp_path / "ckpt" / "last.ckpt")["global_step"] == 4

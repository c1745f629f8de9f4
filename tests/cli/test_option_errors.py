"""A mistake in an option or a config file, through `rlhf-lit`: one `rlhf-lit: error:` line naming the key
as the user can type it, where it was given (the option, or the config file and line), and the nearest
valid choice; exit 2, before any model is built. And every value a shipped config sets can be given
on the command line (null, lists and mappings included).

One case runs `rlhf-lit` as a process of its own (a typo before any model loads; forked from the
test's process, tests/cli_forked.py, which tests/cli/test_cli_forked.py holds to the console script's
output); the other cases call the same entry function in this process (``run_main``), with
``--print_config`` (parse only).
"""

from __future__ import annotations

import json
from pathlib import Path

import cli_forked
import pytest
import yaml
from cli_helpers import FIT_CONFIGS, ROOT, error_line, ppo_config, run_main, write_yaml

OFFLINE = ROOT / "configs" / "offline"


def _parse(*args: str, cwd: Path = ROOT):
    """``rlhf-lit fit <args> --print_config`` in this process, from the project root (the configs' relative paths)."""
    return run_main("fit", *args, "--print_config", cwd=cwd)


def _refused(result) -> str:
    """The error text of a refused option (exit 2, one line, nothing printed)."""
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stdout == ""
    return error_line(result).removeprefix("rlhf-lit: error: ")


def _overlay(tmp_path: Path, text: str) -> str:
    """A second config file (its path as a string, as a user passes it)."""
    path = tmp_path / "overlay.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_a_mistyped_option_is_named_with_its_nearest_option_before_any_model_loads(tmp_path):
    # The models do not exist: the option error must come first (exit 2, not "sft_model not found", exit 1).
    write_yaml(tmp_path / "ppo.yaml", ppo_config(tmp_path, Path("no/sft"), Path("no/rm")))
    result = cli_forked.run("fit", "--config", "ppo.yaml", "--model.init_args.ppo.epochz", "3", cwd=tmp_path)
    assert result.returncode == 2
    assert error_line(result) == (
        "rlhf-lit: error: unknown option --model.init_args.ppo.epochz; did you mean --model.init_args.ppo.epochs?"
    )
    assert "Union subtypes" not in result.stderr and "usage:" not in result.stderr
    assert not (tmp_path / "logs").exists() and not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize(
    ("config", "option", "nearest"),
    [
        ("sft", "--model.init_args.optimizer.lrr", "--model.init_args.optimizer.lr"),
        ("sft", "--model.init_args.lora.rr", "--model.init_args.lora.r"),  # an optional group, unset
        ("reward_model", "--model.init_args.expor_dir", "--model.init_args.export_dir"),
        ("reward_model", "--data.init_args.max_lenght", "--data.init_args.max_length"),
        ("dpo", "--model.init_args.betaa", "--model.init_args.beta"),
        ("ppo", "--model.ppo.epochz", "--model.init_args.ppo.epochs"),  # the short form, told in full
        ("ppo", "--model.init_args.epochs", "--model.init_args.ppo.epochs"),  # a key at the wrong level
        ("ppo", "--data.init_args.prompt_wrds", "--data.init_args.prompt_words"),
        ("ppo", "--trainer.max_stepz", "--trainer.max_steps"),
    ],
)
def test_an_unknown_option_of_any_stage_data_module_or_trainer_names_the_nearest(config, option, nearest):
    result = _parse("--config", str(OFFLINE / f"{config}.yaml"), option, "3")
    full = option.replace("--model.ppo", "--model.init_args.ppo")
    assert _refused(result) == f"unknown option {full}; did you mean {nearest}?"


@pytest.mark.parametrize(
    ("config", "overlay", "line", "told"),
    [
        (
            "ppo",
            "model:\n  init_args:\n    ppo: {epochz: 3}\n",
            3,
            "unknown key model.init_args.ppo.epochz; did you mean model.init_args.ppo.epochs?",
        ),
        (
            "sft",
            "model:\n  init_args:\n    lora:\n      rr: 8\n",
            4,
            "unknown key model.init_args.lora.rr; did you mean model.init_args.lora.r?",
        ),
        (
            "dpo",
            "data:\n  init_args:\n    max_lenght: 64\n",
            3,
            "unknown key data.init_args.max_lenght; did you mean data.init_args.max_length?",
        ),
        (
            "reward_model",
            "trainer:\n  max_stepz: 3\n",
            2,
            "unknown key trainer.max_stepz; did you mean trainer.max_steps?",
        ),
        (
            "reward_model",
            "traner:\n  max_steps: 3\n",
            2,
            "unknown key traner.max_steps; did you mean trainer.max_steps?",
        ),
        (
            "ppo",
            "trainer:\n  callbacks:\n    - class_path: rlhf_lit.callbacks.Checkpoint\n"
            "    - class_path: rlhf_lit.callbacks.OnlineGeneration\n      init_args: {every_n_rolouts: 5}\n",
            5,
            "unknown key trainer.callbacks[1].init_args.every_n_rolouts; "
            "did you mean trainer.callbacks[1].init_args.every_n_rollouts?",
        ),
    ],
    ids=["ppo-group", "sft-lora", "dpo-data", "trainer", "top-level", "callback-in-a-list"],
)
def test_an_unknown_key_in_a_config_file_names_the_file_and_line(tmp_path, config, overlay, line, told):
    path = _overlay(tmp_path, overlay)
    result = _parse("--config", str(OFFLINE / f"{config}.yaml"), "--config", path)
    assert _refused(result) == f"{path}, line {line}: {told}"


def test_the_last_setting_is_the_one_named(tmp_path):
    path = _overlay(tmp_path, "model:\n  init_args:\n    ppo: {epochz: 3}\n")
    after = _parse("--config", str(OFFLINE / "ppo.yaml"), "--model.init_args.ppo.epochz", "2", "--config", path)
    assert _refused(after).startswith(f"{path}, line 3: unknown key model.init_args.ppo.epochz")


def test_a_yaml_syntax_error_names_the_file_line_and_column(tmp_path):
    path = _overlay(tmp_path, "model:\n  init_args:\n    sampling: {max_new_tokens: 8\n    max_rollouts: 2\n")
    told = _refused(_parse("--config", str(OFFLINE / "ppo.yaml"), "--config", path))
    assert told.startswith(f"--config {path}, line 4, column 17: ")
    assert told.endswith("(while parsing a flow mapping that starts at line 3, column 15)")


STAGES = (
    "(choices: rlhf_lit.stages.BoNBoNModule, rlhf_lit.stages.DPOModule, "
    "rlhf_lit.stages.PPOModule, rlhf_lit.stages.RewardModelModule, rlhf_lit.stages.SFTModule)"
)


def test_a_class_that_does_not_exist_is_named_with_the_valid_choices(tmp_path):
    config = (
        (OFFLINE / "sft.yaml")
        .read_text(encoding="utf-8")
        .replace("rlhf_lit.stages.SFTModule", "rlhf_lit.stages.SFTModul")
    )
    path = _overlay(tmp_path, config)
    line = config.splitlines().index("  class_path: rlhf_lit.stages.SFTModul") + 1
    assert _refused(_parse("--config", path)) == (
        f"{path}, line {line}: model.class_path: no class rlhf_lit.stages.SFTModul; "
        f"did you mean rlhf_lit.stages.SFTModule? {STAGES}"
    )
    assert _refused(_parse("--config", str(OFFLINE / "ppo.yaml"), "--data", "PromptDataModul")) == (
        "option --data: no class PromptDataModul; did you mean rlhf_lit.data.PromptDataModule? (choices: "
        "rlhf_lit.data.PreferenceDataModule, rlhf_lit.data.PromptDataModule, rlhf_lit.data.SFTDataModule)"
    )
    callback = _overlay(tmp_path, "trainer:\n  callbacks:\n    - class_path: rlhf_lit.callbacks.RolloutCheckpont\n")
    assert _refused(_parse("--config", str(OFFLINE / "ppo.yaml"), "--config", callback)) == (
        f"{callback}, line 3: trainer.callbacks[0].class_path: no class rlhf_lit.callbacks.RolloutCheckpont; did you "
        "mean rlhf_lit.callbacks.RolloutCheckpoint? (choices: rlhf_lit.callbacks.Checkpoint, "
        "rlhf_lit.callbacks.OnlineGeneration, rlhf_lit.callbacks.OverOptimisationGuard, rlhf_lit.callbacks.Preemption, "
        "rlhf_lit.callbacks.RolloutCheckpoint, rlhf_lit.callbacks.RunProgressBar)"
    )


@pytest.mark.parametrize("seed", ["-1", "4294967296"])
def test_a_run_seed_out_of_numpy_range_is_named_as_the_option_before_any_model_loads(tmp_path, seed):
    # Lightning's own refusal ("-1 is not in bounds, numpy accepts from 0 to 4294967295") names no option.
    write_yaml(tmp_path / "ppo.yaml", ppo_config(tmp_path, Path("no/sft"), Path("no/rm")))
    result = run_main("fit", "--config", "ppo.yaml", "--seed_everything", seed, cwd=tmp_path)
    assert (
        _refused(result) == f"--seed_everything {seed}: a run seed must be in [0, 4294967295] (the seeds numpy takes)"
    )


@pytest.mark.parametrize(
    ("option", "value", "told"),
    [
        (
            "reward",
            "{sources: [{name: rm, weight: .nan}]}",
            "reward source 'rm': weight must be a finite number, got nan",
        ),
        (
            "reward",
            "{sources: [{name: rm, weight: .inf}]}",
            "reward source 'rm': weight must be a finite number, got inf",
        ),
        ("reward.bias", ".nan", "reward.bias must be a finite number, got nan"),
        ("reward.clip", ".nan", "reward.clip must be > 0 or null, got nan"),
        ("reward.missing_eos_penalty", "-.inf", "reward.missing_eos_penalty must be a finite number, got -inf"),
        # inf: NaN weights after the first step, or (eps) no step at all; a NaN loss or reward at the first
        ("optimizer.lr", ".inf", "optimizer.lr must be a finite number, got inf"),
        ("optimizer.eps", ".inf", "optimizer.eps must be a finite number, got inf"),
        ("kl.init_coef", ".inf", "kl.init_coef must be a finite number, got inf"),
        ("ppo.vf_coef", ".inf", "ppo.vf_coef must be a finite number, got inf"),
        ("lora", "{r: 4, alpha: .inf}", "lora.alpha must be a finite number, got inf"),
    ],
)
def test_a_setting_that_is_not_finite_stops_fit_in_one_line_before_any_model_loads(tmp_path, option, value, told):
    # A non-finite reward setting makes every reward non-finite: the updates are skipped until max_skipped_updates
    # stops the run, naming no option. The models do not exist: the refusal must come first.
    write_yaml(tmp_path / "ppo.yaml", ppo_config(tmp_path, Path("no/sft"), Path("no/rm")))
    result = run_main("fit", "--config", "ppo.yaml", f"--model.init_args.{option}={value}", cwd=tmp_path)
    assert result.returncode == 1 and error_line(result) == f"rlhf-lit: error: {told}"


def test_a_value_of_the_wrong_type_names_the_option_and_the_type(tmp_path):
    ppo = str(OFFLINE / "ppo.yaml")
    path = _overlay(tmp_path, "model:\n  init_args:\n    max_rollouts: ten\n")
    assert _refused(_parse("--config", ppo, "--config", path)) == (
        f"{path}, line 3: model.init_args.max_rollouts: expected int, got ten"
    )
    assert _refused(_parse("--config", ppo, "--model.init_args.kl.init_coef", "high")) == (
        "option --model.init_args.kl.init_coef: expected float, got high"
    )
    assert _refused(_parse("--config", ppo, "--model.init_args.critic", "seperate")) == (
        "option --model.init_args.critic: expected one of 'separate', 'shared_trunk', got seperate; "
        "did you mean 'separate'?"
    )
    assert _refused(_parse("--config", ppo, "--trainer.max_epochs", "1.5")) == (
        "option --trainer.max_epochs: expected int or null, got 1.5"
    )


def test_a_wrong_element_in_a_list_names_the_element(tmp_path):
    ppo = str(OFFLINE / "ppo.yaml")
    path = _overlay(
        tmp_path,
        "model:\n  init_args:\n    reward:\n      sources:\n        - {name: rm}\n"
        "        - {name: len, weight: heavy}\n",
    )
    assert _refused(_parse("--config", ppo, "--config", path)) == (
        f"{path}, line 6: model.init_args.reward.sources[1].weight: expected float, got heavy"
    )
    assert _refused(
        _parse("--config", ppo, "--model.init_args.reward.sources", "[{name: rm}, {name: x, wieght: 2}]")
    ) == ("option --model.init_args.reward.sources: unknown key [1].wieght; did you mean [1].weight?")
    assert _refused(_parse("--config", ppo, "--model.init_args.reward.sources", "[rm]")) == (
        "option --model.init_args.reward.sources: no class rm (a class path or a mapping of arguments)"
    )
    assert _refused(_parse("--config", ppo, "--model.init_args.reward.sources", "[3]")) == (
        "option --model.init_args.reward.sources: expected RewardSource, got 3"
    )


# ------------------------------------------------------------------------------------ every config value, typed


def _leaves(node: dict, prefix: str = ""):
    """``(key, value)`` for every value a config sets, as a user would type it: a ``class_path`` mapping
    is ``--key CLASS`` then its ``init_args`` one by one; other mappings are walked into; lists, null and
    scalars are leaves."""
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and "class_path" in value:
            yield name, value["class_path"]
            yield from _leaves(value.get("init_args") or {}, f"{name}.init_args.")
        elif isinstance(value, dict) and value:
            yield from _leaves(value, f"{name}.")
        else:
            yield name, value


def _typed(value) -> str:
    """The text a user types for a value: strings as they are, anything else as YAML flow (JSON)."""
    return value if isinstance(value, str) else json.dumps(value)


def _contains(printed, given) -> bool:
    """Whether the printed value holds the given one (a list element's mapping may gain defaults)."""
    if isinstance(given, dict):
        return isinstance(printed, dict) and all(_contains(printed.get(k), v) for k, v in given.items())
    if isinstance(given, list):
        return isinstance(printed, list) and len(printed) == len(given) and all(map(_contains, printed, given))
    return printed == given and isinstance(printed, bool) == isinstance(given, bool)  # True == 1 in Python


TYPED_AS_TEXT = {"trainer.devices": "1"}
"""Lightning's ``devices`` is ``list[int] | str | int``: a typed ``1`` stays the text ``'1'`` (one device to Lightning)."""


@pytest.mark.parametrize("config", FIT_CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_value_a_config_sets_can_be_given_on_the_command_line(config):
    from jsonargparse._loaders_dumpers import get_yaml_default_loader  # the CLI's own YAML reading

    loader = get_yaml_default_loader()
    leaves = list(_leaves(yaml.load(config.read_text(encoding="utf-8"), Loader=loader)))
    result = _parse(*[part for key, value in leaves for part in (f"--{key}", _typed(value))])
    assert result.returncode == 0, result.stderr[-3000:]
    printed = yaml.load(result.stdout, Loader=loader)
    for key, value in leaves:
        node = printed
        for part in key.split("."):
            node = node[part]
        node = node["class_path"] if isinstance(node, dict) and "class_path" in node else node
        as_text = TYPED_AS_TEXT.get(key)
        assert _contains(node, value) or (as_text is not None and node == as_text), (key, value, node)


def test_null_mappings_and_lists_on_the_command_line_replace_the_config_values():
    ppo = str(OFFLINE / "ppo.yaml")  # sets reward: {missing_eos_penalty: null}
    result = _parse(
        "--config",
        ppo,
        "--model.init_args.reward.missing_eos_penalty",
        "1.5",
        "--model.init_args.reward.missing_eos_penalty",
        "null",
        "--model.init_args.ppo.max_grad_norm",
        "null",
        "--model.init_args.reward",
        "{clip: null, unfinished: as_sampled}",
        "--model.init_args.reward.sources",
        "[{name: rm, function: null}, {name: len, function: "
        '"rlhf_lit.rewards.shaping:length_target", kwargs: {target: 3}, weight: 1.0e-2}]',
    )
    assert result.returncode == 0, result.stderr[-3000:]
    model = yaml.safe_load(result.stdout)["model"]["init_args"]
    assert model["reward"]["missing_eos_penalty"] is None and model["reward"]["clip"] is None
    assert model["reward"]["unfinished"] == "as_sampled" and model["ppo"]["max_grad_norm"] is None
    assert model["reward"]["sources"] == [
        {"name": "rm", "weight": 1.0, "function": None, "kwargs": {}, "aggregate": "mean", "lam": None},
        {
            "name": "len",
            "weight": 0.01,
            "function": "rlhf_lit.rewards.shaping:length_target",
            "kwargs": {"target": 3},
            "aggregate": "mean",
            "lam": None,
        },
    ]

"""The `rlhf-lit` console script: help, config printing, and every YAML in configs/ parses."""

import subprocess
import sys
from pathlib import Path

import pytest
from assets_paths import ROOT
from cli_helpers import FIT_CONFIGS
from cli_in_process import run_main
from suite_env import subprocess_env

CONFIGS = FIT_CONFIGS


def _cli(*args: str) -> subprocess.CompletedProcess:
    """``rlhf-lit <args>`` through the CLI's entry function in this process (``cli_in_process.run_main``:
    output captured, global state restored), from the project root so the offline configs' relative
    paths (assets/...) resolve. The console script itself runs in a subprocess below."""
    return run_main(*args, cwd=ROOT)


def test_fit_help_lists_trainer_model_and_data_options():
    result = _cli("fit", "--help")
    assert result.returncode == 0, result.stderr
    for option in ("--config", "--print_config", "--trainer.strategy", "--model", "--data"):
        assert option in result.stdout


def test_console_script_exits_zero_on_help():
    # `sys.exit(main())` in the generated script must see None, not a CLI object (exit 1).
    script = Path(sys.executable).parent / "rlhf-lit"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=300, env=subprocess_env())
    assert result.returncode == 0, result.stderr
    assert "fit" in result.stdout


@pytest.mark.parametrize(
    "args,built",
    [
        (("fit", "--config", "configs/offline/sft.yaml", "--print_config"), ["fit"]),  # what a run parses with
        (("validate", "--help"), ["validate"]),
        (("--help",), ["fit", "validate", "test", "predict"]),  # the help lists Lightning's four
        (("fti", "--config", "configs/offline/sft.yaml"), ["fit", "validate", "test", "predict"]),  # the choices named
    ],
)
def test_only_the_subcommand_a_command_line_starts_with_gets_its_parser(monkeypatch, args, built):
    # Each subcommand's parser takes every stage's signature: a run builds only its own (RLHFCLI.subcommands).
    from lightning.pytorch.cli import LightningCLI

    prepared = []
    prepare = LightningCLI._prepare_subcommand_parser

    def recording(self, klass, subcommand, **kwargs):
        prepared.append(subcommand)
        return prepare(self, klass, subcommand, **kwargs)

    monkeypatch.setattr(LightningCLI, "_prepare_subcommand_parser", recording)
    result = _cli(*args)
    assert prepared == built
    if args[0] == "fti":
        assert result.returncode == 2 and "fti" in result.stderr and "fit" in result.stderr, result.stderr
    else:
        assert result.returncode == 0, result.stderr[-3000:]
        assert all(name in result.stdout for name in built)


def test_version_is_the_one_version_string():
    import importlib.metadata

    import rlhf_lit

    result = _cli("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"rlhf-lit {rlhf_lit.__version__}\n"
    assert importlib.metadata.version("rlhf-lit") == rlhf_lit.__version__  # pyproject.toml reads it
    assert f"## {rlhf_lit.__version__}" in (ROOT / "CHANGELOG.md").read_text()


def test_there_are_configs_to_check():
    assert CONFIGS, "configs/ holds no YAML"


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_config_parses_against_class_signatures(config):
    # --print_config parses the YAML against the classes' signatures: an unknown or mistyped
    # option, a wrong class_path or a bad value fails here.
    result = _cli("fit", "--config", str(config), "--print_config")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "class_path: rlhf_lit." in result.stdout


def test_the_composed_reward_overlay_keeps_the_demo_config_and_adds_its_sources():
    result = _cli(
        "fit",
        "--config",
        str(ROOT / "configs/demo/ppo.yaml"),
        "--config",
        str(ROOT / "configs/demo/ppo_composed.yaml"),
        "--print_config",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout
    assert "sft_model: logs/demo/sft/model" in printed and "batch_size: 64" in printed  # the demo's
    assert "unfinished: with_eos" in printed  # the overlay's reward group keeps the demo's RM reading
    assert "function: rlhf_lit.rewards.shaping:length_target" in printed and "name: rm" in printed
    assert "export_dir: logs/demo/ppo_composed/model" in printed


@pytest.mark.parametrize("estimator", ["gae", "grpo", "dr_grpo", "rloo", "reinforce_pp"])
def test_each_estimator_overlay_on_the_verifiable_task_parses(estimator):
    result = _cli(
        "fit",
        "--config",
        str(ROOT / "configs/offline/verifiable.yaml"),
        "--config",
        str(ROOT / f"configs/offline/estimators/{estimator}.yaml"),
        "--print_config",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"estimator: {estimator}\n" in result.stdout
    assert "function: rlhf_lit.rewards.rules:mentions_ground_truth" in result.stdout  # the task's reward


@pytest.mark.parametrize(
    "option,default,other,bad,choices",
    [
        ("ppo.whiten_scope", "global", "rank", "all", "'global', 'rank'"),
        ("sampling.decode", "eager", "compiled", "fast", "'eager', 'compiled'"),
        ("ppo.forward", "eager", "compiled", "jit", "'eager', 'compiled'"),
    ],
)
def test_a_choice_option_shows_its_default_takes_its_other_value_and_names_itself_otherwise(
    option, default, other, bad, choices
):
    ppo = str(ROOT / "configs/offline/ppo.yaml")
    field = option.split(".")[-1]
    shown = _cli("fit", "--config", ppo, "--print_config")
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert f"{field}: {default}\n" in shown.stdout
    taken = _cli("fit", "--config", ppo, f"--model.init_args.{option}", other, "--print_config")
    assert taken.returncode == 0 and f"{field}: {other}\n" in taken.stdout
    refused = _cli("fit", "--config", ppo, f"--model.init_args.{option}", bad, "--print_config")
    assert refused.returncode == 2
    lines = [line for line in refused.stderr.splitlines() if line.startswith("rlhf-lit: error:")]
    assert lines == [f"rlhf-lit: error: option --model.init_args.{option}: expected one of {choices}, got {bad}"]
    assert "Traceback" not in refused.stderr


def test_compiled_passes_refuse_lora_with_gradient_checkpointing_in_one_line(stories_rm):
    ppo = str(ROOT / "configs/offline/ppo.yaml")
    refused = _cli(
        "fit",
        "--config",
        ppo,
        "--model.init_args.ppo.forward",
        "compiled",
        "--model.init_args.memory.gradient_checkpointing",
        "true",
        "--model.init_args.lora.r",
        "4",
        "--model.init_args.sft_model",
        str(ROOT / "assets/models/stories260K"),
        "--model.init_args.reward_model",
        stories_rm,
    )
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    lines = [line for line in refused.stderr.splitlines() if line.startswith("rlhf-lit: error:")]
    assert lines == [
        "rlhf-lit: error: ppo.forward: compiled does not run with memory.gradient_checkpointing and LoRA "
        "together; leave ppo.forward eager, or turn off one of them"
    ], refused.stderr[-2000:]

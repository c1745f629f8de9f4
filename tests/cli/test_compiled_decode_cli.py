"""``--model.init_args.sampling.decode compiled`` from the command line.

A PPO fit (its policy stories260K cut to 2 of its 5 decoder layers, tests/conftest.py's
``two_layer_stories``: a decode step of 3 layers fewer to compile) logs the compile cost of its decode path per rollout
(``compile/decode_graphs``, ``compile/decode_s``); its prompt loader keeps a smaller last batch
(``drop_last: false``), which compiles a second graph (a batch is not padded up to the configured
size: the padding rows would change the real rows' samples, tests/models/test_compiled_generation.py).
Under ``--trainer.precision bf16-mixed`` the rollouts sample inside Lightning's autocast, and decode
compiled as they do in float32 (the static cache stores what the eager cache stores,
tests/models/test_compiled_autocast.py). Under fsdp / fsdp2 the option is refused in one line before
any model is loaded or any process is started.
"""

from __future__ import annotations

import csv

import cli_forked
import pytest
from cli_helpers import STORIES, error_line, ppo_config, rlhf_lit, run_main, write_yaml

from rlhf_lit.models.compiled_generation import compile_stats

COMPILED = ("--model.init_args.sampling.decode", "compiled")


@pytest.mark.slow
def test_ppo_fit_logs_the_decode_compile_cost_and_a_smaller_last_batch_compiles_once_more(
    tmp_path, stories_rm, two_layer_stories
):
    # 6 prompts in batches of 4 with the last batch kept: rollout 0 samples 4 rows, rollout 1 samples 2.
    config = ppo_config(tmp_path, two_layer_stories, stories_rm, max_rollouts=2)
    config["data"]["init_args"].update(max_records=6, drop_last=False)
    write_yaml(tmp_path / "ppo.yaml", config)
    result = rlhf_lit("fit", "--config", str(tmp_path / "ppo.yaml"), *COMPILED, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (path,) = (tmp_path / "logs").rglob("metrics.csv")
    rows = {int(r["step"]): r for r in csv.DictReader(path.open()) if r.get("objective/kl")}
    assert sorted(rows) == [0, 1]
    # one graph for the batch of 4, one more for the batch of 2 (running totals of the process)
    assert [float(rows[i]["compile/decode_graphs"]) for i in (0, 1)] == [1.0, 2.0]
    seconds = [float(rows[i]["compile/decode_s"]) for i in (0, 1)]
    assert 0.0 < seconds[0] < seconds[1]  # each compiling call adds its wall time
    assert seconds[1] <= sum(float(rows[i]["time/generate_s"]) for i in (0, 1))  # part of the generate phases


@pytest.mark.slow
def test_ppo_fit_decodes_compiled_under_bf16_mixed_precision(tmp_path, stories_rm, two_layer_stories):
    """One rollout of a fit with ``trainer.precision: bf16-mixed``: the rollout's ``generate`` runs
    inside Lightning's bf16 autocast through the static cache and the compiled step."""
    config = ppo_config(tmp_path, two_layer_stories, stories_rm, max_rollouts=1)
    config["model"]["init_args"]["optimizer"].update(warmup_steps=0, schedule="constant")  # one rollout
    config["trainer"]["precision"] = "bf16-mixed"
    config["model"]["init_args"]["sampling"]["decode"] = "compiled"
    write_yaml(tmp_path / "ppo.yaml", config)
    before = compile_stats().graphs  # the process's totals: this process may have compiled before
    result = run_main("fit", "--config", str(tmp_path / "ppo.yaml"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (path,) = (tmp_path / "logs").rglob("metrics.csv")
    (row,) = [r for r in csv.DictReader(path.open()) if r.get("objective/kl")]
    assert float(row["compile/decode_graphs"]) == compile_stats().graphs == before + 1


def test_compiled_decoding_under_fsdp2_is_refused_in_one_line_before_anything_is_built(tmp_path):
    config = ppo_config(tmp_path, STORIES, tmp_path / "no-reward-model-is-loaded")
    config["trainer"].update(strategy="fsdp2", devices=2)
    write_yaml(tmp_path / "ppo.yaml", config)
    result = cli_forked.run("fit", "--config", str(tmp_path / "ppo.yaml"), *COMPILED, cwd=tmp_path)
    assert result.returncode == 2
    line = error_line(result)
    assert line.startswith("rlhf-lit: error: sampling.decode compiled is not supported under fsdp / fsdp2")
    assert "sampling.decode eager" in line and "--trainer.strategy ddp" in line
    # refused before the second process started (a process of its own, forked: Lightning's logger
    # writes this line on the process's stderr, which an in-process run would not capture)
    assert "Initializing distributed" not in result.stderr
    assert not (tmp_path / "logs").exists() and not (tmp_path / "export").exists()


def test_the_fsdp2_strategy_given_by_class_path_is_refused_too(tmp_path):
    config = ppo_config(tmp_path, STORIES, tmp_path / "no-reward-model-is-loaded")
    config["trainer"].update(strategy={"class_path": "rlhf_lit.strategies.FSDP2Strategy"}, devices=2)
    config["model"]["init_args"]["sampling"]["decode"] = "compiled"
    write_yaml(tmp_path / "ppo.yaml", config)
    result = run_main("fit", "--config", str(tmp_path / "ppo.yaml"), cwd=tmp_path)
    assert result.returncode == 2
    assert "sampling.decode compiled is not supported under fsdp / fsdp2" in error_line(result)


def test_compiled_scoring_and_training_passes_under_fsdp2_are_refused_too(tmp_path):
    config = ppo_config(tmp_path, STORIES, tmp_path / "no-reward-model-is-loaded")
    config["trainer"].update(strategy="fsdp2", devices=2)
    config["model"]["init_args"]["ppo"] = {**config["model"]["init_args"].get("ppo", {}), "forward": "compiled"}
    write_yaml(tmp_path / "ppo.yaml", config)
    result = run_main("fit", "--config", str(tmp_path / "ppo.yaml"), cwd=tmp_path)
    assert result.returncode == 2
    assert error_line(result) == (
        "rlhf-lit: error: ppo.forward compiled is not supported under fsdp / fsdp2; use "
        "ppo.forward eager, or --trainer.strategy ddp (or one device)"
    )
    assert not (tmp_path / "logs").exists()

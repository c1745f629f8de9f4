"""What a user sees when something is wrong, driven through `rlhf-lit`.

Each case asserts the exit status, the one message (no traceback) and that nothing already
written was lost. They run the CLI's entry function in this process (``run_main``: the same
main(), output captured, global state restored); a real subprocess of the console script checks one
case of each format elsewhere (an option error: test_option_errors.py; an error raised in the run:
test_rankings_cli.py; an argparse command's error: test_commands_cli.py) and the end-to-end runs.
Exports never replace what rlhf-lit did not write; the last checkpoint is the state at the end of fit; a NaN reward stops the run with a message and no NaN weights on disk.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import torch
from cli_helpers import STORIES, TINYSTORIES, error_line, ppo_config, run_main, sft_config, write_yaml

from rlhf_lit.stages.export import MARKER

# ------------------------------------------------------------------------------------ exports


def test_export_dir_that_rlhf_lit_did_not_write_is_refused_before_training(tmp_path, stories_rm):
    mine = tmp_path / "work"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    for export_dir in (str(mine), "."):  # "." is the working directory, with the user's files in it
        config = ppo_config(tmp_path, STORIES, stories_rm, export_dir=export_dir, export_existing="replace")
        write_yaml(mine / "ppo.yaml", config)
        result = run_main("fit", "--config", str(mine / "ppo.yaml"), cwd=mine)
        assert result.returncode == 1
        assert "is not empty and was not written by rlhf-lit" in error_line(result)
        assert sorted(p.name for p in mine.iterdir()) == ["notes.txt", "ppo.yaml"]
        assert (mine / "notes.txt").read_text() == "keep me"
    assert not (tmp_path / "ckpt").exists()  # refused before the first rollout


def test_an_earlier_export_is_kept_unless_replace_is_asked_and_the_run_says_where_it_wrote(tmp_path):
    write_yaml(tmp_path / "sft.yaml", sft_config(tmp_path, TINYSTORIES, max_steps=2))
    first = run_main("fit", "--config", str(tmp_path / "sft.yaml"), cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    export = tmp_path / "export"
    assert f"[rlhf-lit] exported SFT model to {export}" in first.stdout
    weights = (export / "model.safetensors").read_bytes()
    assert json.loads((export / MARKER).read_text())["what"] == "SFT model"

    again = run_main("fit", "--config", str(tmp_path / "sft.yaml"), cwd=tmp_path)
    assert again.returncode == 1
    assert "holds an earlier rlhf-lit export (SFT model, written" in error_line(again)
    assert "export_existing replace" in again.stderr
    assert (export / "model.safetensors").read_bytes() == weights

    replaced = run_main(
        "fit",
        "--config",
        str(tmp_path / "sft.yaml"),
        "--model.init_args.export_existing",
        "replace",
        "--trainer.max_steps",
        "4",
        cwd=tmp_path,
    )
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    assert (export / "model.safetensors").read_bytes() != weights
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary left


def test_last_checkpoint_is_the_state_at_the_end_of_fit(tmp_path):
    # Periodic saves every 2 steps: 2 and 4; the run ends at step 5, and last.ckpt must hold step 5.
    write_yaml(tmp_path / "sft.yaml", sft_config(tmp_path, TINYSTORIES, max_steps=5))
    result = run_main("fit", "--config", str(tmp_path / "sft.yaml"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    last = torch.load(tmp_path / "ckpt" / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["global_step"] == 5


# ------------------------------------------------------------------------------------ NaN and vocabularies


def test_a_nan_reward_is_skipped_and_stops_the_run_without_nan_weights_on_disk(tmp_path, nan_rm):
    # The critic starts from the SFT model (a zero head): only the reward is NaN.
    write_yaml(tmp_path / "ppo.yaml", ppo_config(tmp_path, STORIES, nan_rm, max_rollouts=10, value_model=str(STORIES)))
    result = run_main("fit", "--config", str(tmp_path / "ppo.yaml"), cwd=tmp_path)
    assert result.returncode == 1
    line = error_line(result)
    assert "stopping: 3 updates in a row skipped for non-finite values" in line
    assert "rollout 2: non-finite reward scores" in line and "max_skipped_updates=3" in line
    assert result.stderr.count("skipped an update: rollout") == 3
    assert not (tmp_path / "export").exists()
    checkpoints = sorted((tmp_path / "ckpt").glob("*.ckpt"))
    assert [c.name for c in checkpoints] == ["last.ckpt", "rollout=2.ckpt"]  # skipped rollouts count
    for ckpt in checkpoints:  # the skipped rollouts changed no weight
        state = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
        assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point()), ckpt


FP16_PLUGIN = {
    "class_path": "lightning.pytorch.plugins.precision.MixedPrecision",
    "init_args": {
        "precision": "16-mixed",
        "device": "cpu",
        "scaler": {"class_path": "torch.amp.GradScaler", "init_args": {"device": "cpu"}},
    },
}
"""fp16 with a GradScaler on a CPU (``--trainer.precision 16-mixed`` is turned into bf16-mixed there)."""


def test_a_diverged_fp16_run_stops_instead_of_skipping_every_step_silently(tmp_path):
    # lr 1e4: the first step sends the weights so far that every later loss is NaN. The GradScaler
    # skips those steps by itself; the guard counts them as it counts NaN gradients in 32-bit.
    data = tmp_path / "paragraphs.txt"
    data.write_text(TINYSTORIES.read_text(encoding="utf-8")[:20000], encoding="utf-8")
    config = sft_config(tmp_path, data, max_steps=6, model={"optimizer": {"lr": 1.0e4}, "max_skipped_updates": 2})
    config["trainer"]["plugins"] = [FP16_PLUGIN]
    write_yaml(tmp_path / "sft.yaml", config)
    result = run_main("fit", "--config", "sft.yaml", cwd=tmp_path)
    assert result.returncode == 1
    assert error_line(result).startswith(
        "rlhf-lit: error: stopping: 2 updates in a row skipped for non-finite values; "
        "the last: non-finite gradients of the optimizer at step 2, skipped by the "
        "fp16 GradScaler at loss scale 32768; the loss was not finite"
    )
    assert result.stderr.count("skipped an update:") == 2
    assert not (tmp_path / "export").exists()


def test_a_reward_model_with_another_vocabulary_is_refused(tmp_path, gpt2_rm):
    write_yaml(tmp_path / "ppo.yaml", ppo_config(tmp_path, STORIES, gpt2_rm))
    result = run_main("fit", "--config", str(tmp_path / "ppo.yaml"), cwd=tmp_path)
    assert result.returncode == 1
    assert f"reward_model {gpt2_rm} has a different vocabulary from the policy's tokenizer (50257 vs 512 tokens)" in (
        error_line(result)
    )


# ------------------------------------------------------------------------------------ bad models


def test_missing_model_path_names_the_config_that_produces_it(tmp_path, stories_rm):
    config = ppo_config(tmp_path, Path("out/sft/model"), stories_rm)
    write_yaml(tmp_path / "ppo.yaml", config)
    write_yaml(tmp_path / "configs" / "sft.yaml", {"model": {"init_args": {"export_dir": "out/sft/model"}}})
    result = run_main("fit", "--config", "ppo.yaml", cwd=tmp_path)
    assert result.returncode == 1
    assert error_line(result) == (
        "rlhf-lit: error: sft_model not found: out/sft/model (no such directory; it is the export of "
        "configs/sft.yaml: run `rlhf-lit fit --config configs/sft.yaml` first)"
    )


def test_a_data_folder_given_as_a_model_is_named(tmp_path, stories_rm):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text('{"prompt": "a", "response": "b"}\n')
    write_yaml(tmp_path / "ppo.yaml", ppo_config(tmp_path, data, stories_rm))
    result = run_main("fit", "--config", "ppo.yaml", cwd=tmp_path)
    assert result.returncode == 1
    assert (
        error_line(result)
        == f"rlhf-lit: error: sft_model '{data}' is not a Hugging Face model directory (no config.json in it)"
    )


def test_a_hub_model_without_network_fails_at_once_with_the_cause(tmp_path, stories_rm):
    write_yaml(tmp_path / "ppo.yaml", ppo_config(tmp_path, Path("no-such-org/no-such-model"), stories_rm))
    offline = run_main("fit", "--config", "ppo.yaml", cwd=tmp_path, env={"HF_HUB_OFFLINE": "1"})
    assert offline.returncode == 1
    assert "sft_model 'no-such-org/no-such-model' is not in the local Hugging Face cache and HF_HUB_OFFLINE is set" in (
        error_line(offline)
    )
    # A hub that does not answer (a closed local port): the same at once, no minute of retries.
    unreachable = run_main("fit", "--config", "ppo.yaml", cwd=tmp_path, env={"HF_ENDPOINT": "http://127.0.0.1:9"})
    assert unreachable.returncode == 1
    assert "is not in the local Hugging Face cache and the Hugging Face hub cannot be reached" in error_line(
        unreachable
    )


# ------------------------------------------------------------------------------------ bad data


def _sft_on(tmp_path, data_file: Path, **data) -> tuple:
    """One SFT step on ``data_file`` (``fields`` format plus ``data`` options) through the CLI, in this process."""
    write_yaml(tmp_path / "sft.yaml", sft_config(tmp_path, data_file, max_steps=1, data={"format": "fields", **data}))
    return run_main("fit", "--config", str(tmp_path / "sft.yaml"), cwd=tmp_path)


def _records(n: int) -> list[str]:
    """``n`` valid prompt / response records as JSON lines."""
    return [json.dumps({"prompt": f"Tom had a ball number {i}", "response": " and he was happy."}) for i in range(n)]


def test_jsonl_with_a_byte_order_mark_is_read(tmp_path):
    data = tmp_path / "bom.jsonl"
    data.write_text("\ufeff" + "\n".join(_records(8)) + "\n", encoding="utf-8")
    result = _sft_on(tmp_path, data)
    assert result.returncode == 0, result.stderr[-3000:]


def test_a_file_that_is_not_utf8_is_named_with_its_line(tmp_path):
    data = tmp_path / "latin1.jsonl"
    data.write_bytes(
        ("\n".join(_records(2)) + "\n").encode() + '{"prompt": "caf\xe9", "response": "x"}\n'.encode("latin-1")
    )
    result = _sft_on(tmp_path, data)
    assert result.returncode == 1
    assert error_line(result).startswith(f"rlhf-lit: error: {data} line 3: not UTF-8 text (byte 0xe9")


def test_a_truncated_gzip_is_named(tmp_path):
    data = tmp_path / "cut.jsonl.gz"
    data.write_bytes(gzip.compress(("\n".join(_records(50)) + "\n").encode())[:-30])
    result = _sft_on(tmp_path, data)
    assert result.returncode == 1
    assert error_line(result).startswith(f"rlhf-lit: error: {data}: not a complete gzip file")


def test_skipped_and_truncated_records_are_counted_where_the_user_sees_them(tmp_path):
    data = tmp_path / "some-bad.jsonl"
    long = json.dumps({"prompt": "Once", "response": " and then" * 60})  # longer than max_length 64
    data.write_text("\n".join([*_records(7), long, "{not json", json.dumps({"prompt": 3, "response": "x"})]) + "\n")
    result = _sft_on(tmp_path, data, skip_invalid=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[rlhf-lit] train: 1 of 8 responses did not fit in max_length: cut at the end, without EOS" in result.stderr
    assert f"[rlhf-lit] {data}: skipped 1 lines that do not parse as a JSON object" in result.stderr
    assert "skipped 1 of 9 invalid records (skip_invalid=True); first: " in result.stderr


def test_a_minibatch_larger_than_the_rollout_is_refused_before_any_rollout(tmp_path, stories_rm):
    write_yaml(tmp_path / "ppo.yaml", ppo_config(tmp_path, STORIES, stories_rm, ppo={"minibatch_size": 8}))
    result = run_main("fit", "--config", "ppo.yaml", cwd=tmp_path)
    assert result.returncode == 1
    assert error_line(result) == (
        "rlhf-lit: error: the rollout batch (4 prompts per process: the data module's batch_size) must be a "
        "multiple of ppo.minibatch_size * ppo.grad_accum = 8 * 1"
    )
    assert not (tmp_path / "ckpt").exists()


# ------------------------------------------------------------------------------------ options


def test_a_bad_option_value_is_one_line_and_debug_shows_the_full_report(tmp_path, stories_rm):
    write_yaml(tmp_path / "ppo.yaml", ppo_config(tmp_path, STORIES, stories_rm))
    result = run_main("fit", "--config", "ppo.yaml", "--model.init_args.ppo.epochs", "abc", cwd=tmp_path)
    assert result.returncode == 2
    assert error_line(result) == "rlhf-lit: error: option --model.init_args.ppo.epochs: expected int, got abc"
    assert "Union subtypes" not in result.stderr and "usage:" not in result.stderr
    debug = run_main("fit", "--config", "ppo.yaml", "--model.init_args.ppo.epochs", "abc", "--debug", cwd=tmp_path)
    assert debug.returncode == 2 and "Union subtypes" in debug.stderr
    bad_value = run_main("fit", "--config", "ppo.yaml", "--model.init_args.kl.estimator", "k2", cwd=tmp_path)
    assert bad_value.returncode == 1
    assert "kl.estimator='k2' does not estimate the KL in nats" in error_line(bad_value)
    traced = run_main(
        "fit", "--config", "ppo.yaml", "--model.init_args.kl.estimator", "k2", cwd=tmp_path, env={"RLHF_LIT_DEBUG": "1"}
    )
    assert traced.returncode == 1 and "Traceback" in traced.stderr

"""Bad data through ``rlhf-lit fit`` (in process, ``cli_in_process.run_main``): one ``rlhf-lit: error:`` line
naming the file, the record and the field, exit status 1, no traceback, before any training step."""

import json

import pytest
import yaml
from assets_paths import STORIES260K
from cli_in_process import run_main

PAIR = '{"prompt": "Once upon a time", "chosen": " there was a cat.", "rejected": " a dog ran.", "m": %s}'


def _fit_reward_model(tmp_path, lines: list[str], fields: dict, **data_options) -> str:
    """The one error line of a reward-model fit on ``lines`` (written as they are) read with ``fields`` (and
    ``data_options``, more of the data module's options)."""
    data = tmp_path / "d.jsonl"
    data.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    config = {
        "trainer": {"accelerator": "cpu", "devices": 1, "max_steps": 1, "logger": False, "enable_progress_bar": False},
        "model": {
            "class_path": "rlhf_lit.stages.RewardModelModule",
            "init_args": {"model": str(STORIES260K), "normalize": "none", "export_dir": str(tmp_path / "export")},
        },
        "data": {
            "class_path": "rlhf_lit.data.PreferenceDataModule",
            "init_args": {
                "train_path": str(data),
                "format": "fields",
                "fields": fields,
                "max_length": 64,
                "max_prompt_length": 32,
                **data_options,
            },
        },
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    result = run_main("fit", "--config", "c.yaml", cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "Trainer.fit" not in result.stderr and not (tmp_path / "export").exists()
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("rlhf-lit: error:")]
    return line


@pytest.mark.parametrize(("value", "read"), [("NaN", "nan"), ("Infinity", "inf"), ("-1e400", "-inf")])
def test_a_margin_that_is_not_finite_is_named(tmp_path, value, read):
    # Python's JSON reader takes NaN and Infinity; the pair's loss was NaN and its update skipped, unnamed.
    line = _fit_reward_model(tmp_path, [PAIR % "1.0", PAIR % value], {"margin": "m"})
    assert line == f"rlhf-lit: error: {tmp_path / 'd.jsonl'} line 2: field 'm' is {read}, not a finite number"


def test_a_pretty_printed_json_record_is_named_as_one_object_not_as_invalid_json(tmp_path):
    pretty = json.dumps({"prompt": "Once", "chosen": " a cat", "rejected": " a dog"}, indent=2).splitlines()
    line = _fit_reward_model(tmp_path, pretty, {})
    assert line == (
        f"rlhf-lit: error: {tmp_path / 'd.jsonl'}: one JSON object over 5 lines (keys: prompt, chosen, rejected), "
        "not JSON Lines; write one record a line (JSON Lines), or a .json array of records"
    )


def test_a_data_seed_torch_cannot_take_is_named(tmp_path):
    # torch's generator said "Overflow when unpacking long long" at the first batch, naming nothing.
    line = _fit_reward_model(tmp_path, [PAIR % "1.0"] * 4, {"margin": "m"}, seed=2**64)
    assert line == f"rlhf-lit: error: seed must be in [{-(2**63)}, {2**63 - 1}], got {2**64}"

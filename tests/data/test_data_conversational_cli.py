"""Conversational data through ``rlhf-lit fit`` (in process, ``cli_in_process.run_main``): the line
``auto`` logs, and one ``rlhf-lit: error:`` line without a traceback for a bad message, a record
``auto`` cannot read and a tokenizer without a chat template. Each run stops in the data module's
setup, before any training step."""

import json
import shutil

import pytest
import yaml
from assets_paths import ASSETS, STORIES260K
from cli_in_process import run_main

CHAT_MODEL = ASSETS / "models" / "stories260K-chat"
TURNS = [{"role": "user", "content": "Tell me a story"}, {"role": "assistant", "content": "Once upon a time."}]


def _fit(tmp_path, records, model):
    lines = (r if isinstance(r, str) else json.dumps(r) for r in records)  # a string: a line as written
    (tmp_path / "d.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    config = {
        "trainer": {"accelerator": "cpu", "devices": 1, "max_steps": 1, "logger": False, "enable_progress_bar": False},
        "model": {
            "class_path": "rlhf_lit.stages.SFTModule",
            "init_args": {"model": str(model), "export_dir": str(tmp_path / "export")},
        },
        "data": {
            "class_path": "rlhf_lit.data.SFTDataModule",
            "init_args": {"train_path": str(tmp_path / "d.jsonl"), "max_length": 64, "max_prompt_length": 32},
        },
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    result = run_main("fit", "--config", "c.yaml", cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("rlhf-lit: error:")]
    return line, result.stderr


@pytest.mark.parametrize(
    ("records", "model", "message"),
    [
        (
            [{"messages": TURNS}, {"messages": [TURNS[0], {"role": "bot", "content": "Hi"}]}],
            CHAT_MODEL,
            "{path} line 2: field 'messages[1]' has role 'bot'; known roles: system, user, assistant",
        ),
        (
            [{"question": "q", "answer": "a"}],
            CHAT_MODEL,
            "{path} record 1 ({path} line 1): cannot tell the record format from its keys (question, answer); set "
            "format: one of fields, hh_rlhf, alpaca, paragraphs, rankings, messages, prompt_completion, implicit_prompt, "
            "text",
        ),
        (
            [{"messages": TURNS}],
            STORIES260K,
            f"the data is conversational (lists of messages) but the tokenizer '{STORIES260K}' has no chat template to "
            "render them; use a tokenizer that has one, or data with string prompts and responses",
        ),
    ],
)
def test_bad_conversational_data_is_one_error_line(tmp_path, records, model, message):
    line, stderr = _fit(tmp_path, records, model)
    path = tmp_path / "d.jsonl"
    assert line == "rlhf-lit: error: " + message.format(path=path)
    if "messages" in records[0]:
        assert f"{path}: format auto read as messages (record 1 keys: messages)" in stderr


def test_a_field_given_twice_is_one_error_line_naming_the_record_and_the_field(tmp_path):
    # json keeps the last of two equal keys: this record would train on the user's turn as the assistant's.
    twice = (
        '{"messages": [{"role": "user", "content": "Hi", "role": "assistant"}, {"role": "assistant", "content": "a"}]}'
    )
    line, _ = _fit(tmp_path, [{"messages": TURNS}, twice], CHAT_MODEL)
    path = tmp_path / "d.jsonl"
    assert (
        line
        == f"rlhf-lit: error: {path} line 2: field 'messages[0].role' is given twice; JSON keeps only the last: remove one"
    )


def test_a_conversation_the_chat_template_refuses_is_one_error_line_naming_the_record(tmp_path):
    # Some templates raise on what they do not render (Gemma: a system message; Llama 2: roles that
    # do not alternate): a copy of the chat model whose template refuses system messages so.
    model = tmp_path / "strict"
    shutil.copytree(CHAT_MODEL, model)
    config = json.loads((model / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = (
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
        + config["chat_template"]
    )
    (model / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    records = [{"messages": TURNS}, {"messages": [{"role": "system", "content": "Be kind."}, *TURNS]}]
    line, _ = _fit(tmp_path, records, model)
    assert line == (
        f"rlhf-lit: error: {tmp_path / 'd.jsonl'} line 2: the chat template of tokenizer '{model}' cannot render "
        "this conversation: System role not supported"
    )

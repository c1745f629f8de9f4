"""``rlhf-lit evaluate`` and ``rlhf-lit best-of-n`` read their prompts as ``fit`` reads data: the shipped HH-RLHF
``.jsonl.gz``, ``messages`` files, gzipped JSONL, a hub dataset's split, and a fit config's held-out split, which
is checked against the prompts the config's own data module holds out (set up by the data module itself).

Expected rendered prompts are written by hand from the template of ``assets/models/stories260K-chat``
(``<s>``, ``System: ...\\n``, ``User: ...\\n``, an assistant turn ``Assistant: ...</s>\\n``, the generation
prompt ``Assistant:``); the HH prompts from the first record of the shipped file (its human turns quoted).
"""

from __future__ import annotations

import gzip
import json
import logging

import pytest
from assets_paths import HH_RLHF, STORIES260K, STORIES260K_CHAT
from cli_helpers import error_line, ids_of, ppo_config, run_main, write_yaml
from hub_stand_in import fake_hub

import rlhf_lit.models
from rlhf_lit.data import PreferenceDataModule, PromptDataModule
from rlhf_lit.tokenizer import load_tokenizer

CHAT, STORIES = str(STORIES260K_CHAT), str(STORIES260K)
FIRST_HUMAN = "what are some pranks with a pen i can do?"
LAST_HUMAN = "okay some of these do not have anything to do with pens"
"""The first and last human turns of the shipped HH file's first chosen transcript."""


def evaluate(tmp_path, policy: str, *prompt_options: str) -> dict:
    """``rlhf-lit evaluate`` of ``policy`` (2 new tokens) on the prompts the options name; the JSON it wrote."""
    out = tmp_path / "eval.json"
    result = run_main(
        "evaluate", "--policy", policy, *prompt_options, "--max-new-tokens", "2", "--out", str(out), "--overwrite",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


def test_evaluate_reads_the_shipped_hh_file_cut_at_the_last_human_turn(tmp_path, fed):
    data = evaluate(tmp_path, CHAT, "--prompts", str(HH_RLHF), "--max-prompts", "2")
    first = data["samples"][0]
    assert [m["role"] for m in first["prompt"]] == ["user", "assistant", "user", "assistant", "user"]
    assert first["prompt_text"].startswith(f"<s>User: {FIRST_HUMAN}\nAssistant: Are you looking for practical")
    assert first["prompt_text"].endswith(f"</s>\nUser: {LAST_HUMAN}\nAssistant:")
    assert "Human:" not in first["prompt_text"]
    assert data["config"]["num_prompts"] == 2 and len(fed) == 2
    # a policy without a template reads the transcript as the string it is, up to its last "Assistant:"
    plain = evaluate(tmp_path, STORIES, "--prompts", str(HH_RLHF), "--max-prompts", "1", "--prompt-format", "hh_rlhf")
    prompt = plain["samples"][0]["prompt"]
    assert prompt.startswith(f"\n\nHuman: {FIRST_HUMAN}\n\nAssistant:")
    assert prompt.endswith(f"\n\nHuman: {LAST_HUMAN}\n\nAssistant:") and plain["samples"][0]["prompt_text"] == prompt


def test_best_of_n_reads_a_gzipped_messages_file(tmp_path, fed, stories_rm):
    records = [
        {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q1"},
                      {"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"},
                      {"role": "assistant", "content": "A2"}]},
        {"messages": [{"role": "user", "content": "Hi"}]},
    ]  # fmt: skip
    path = tmp_path / "m.jsonl.gz"
    path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in records).encode()))
    out = tmp_path / "bon.json"
    result = run_main(
        "best-of-n", "--policy", CHAT, "--reward-model", stories_rm, "--prompts", str(path), "--n", "1,2",
        "--max-new-tokens", "2", "--out", str(out), cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    # each prompt's M = 2 samples in a row; the conversation without its last assistant turn
    assert fed[::2] == [
        ids_of("System: S\nUser: Q1\nAssistant: A1</s>\nUser: Q2\nAssistant:"),
        ids_of("User: Hi\nAssistant:"),
    ]
    assert json.loads(out.read_text())["prompt_texts"][1] == "<s>User: Hi\nAssistant:"


def fit_config(tmp_path, module: str, seed_everything: int, **init_args) -> str:
    """A fit config whose data section is what the prompt source reads (the model section is never built)."""
    config = {
        "seed_everything": seed_everything,
        "model": {"class_path": "rlhf_lit.stages.PPOModule", "init_args": {"sft_model": STORIES}},
        "data": {"class_path": f"rlhf_lit.data.{module}", "init_args": init_args},
    }
    return str(write_yaml(tmp_path / f"{module}_{seed_everything}.yaml", config))


def held_out_ids(module: type, tokenizer, seed: int, **init_args) -> list[list[int]]:
    """The prompt ids of the validation split the data module holds out, set up by the data module itself."""
    dm = module(tokenizer=tokenizer, seed=seed, **init_args)
    dm.setup("fit")
    return [item["chosen_input_ids"][: item["prompt_length"]] if "prompt_length" in item else item["input_ids"]
            for item in dm.val_dataset]  # fmt: skip


def test_a_fit_config_s_held_out_split_is_the_one_its_data_module_holds_out(tmp_path, fed):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Prompt number {i} is here"}) + "\n" for i in range(20)))
    init_args = {"train_path": str(path), "val_fraction": 0.25}
    config = fit_config(tmp_path, "PromptDataModule", 7, **init_args)
    evaluate(tmp_path, STORIES, "--prompts-config", config, "--prompt-split", "val")
    tokenizer = load_tokenizer(STORIES)
    want = held_out_ids(PromptDataModule, tokenizer, 7, **init_args)  # seed unset: the run seed, 7
    assert len(want) == 5 and fed == want
    fed.clear()
    evaluate(tmp_path, STORIES, "--prompts-config", config, "--prompt-seed", "8")  # the fit run with another seed
    assert fed == held_out_ids(PromptDataModule, tokenizer, 8, **init_args) and fed != want
    fed.clear()
    evaluate(tmp_path, STORIES, "--prompts-config", config, "--prompt-split", "train")
    assert len(fed) == 15 and not set(map(tuple, fed)) & set(map(tuple, want))


def test_a_reward_model_config_s_held_out_hh_pairs_give_their_prompts_as_the_chat_policy_reads_them(tmp_path, fed):
    init_args = {"train_path": str(HH_RLHF), "format": "hh_rlhf", "max_records": 24, "val_fraction": 0.25,
                 "max_length": 1024, "max_prompt_length": 1000}  # fmt: skip
    config = fit_config(tmp_path, "PreferenceDataModule", 3, **init_args)
    evaluate(tmp_path, CHAT, "--prompts-config", config)
    want = held_out_ids(PreferenceDataModule, load_tokenizer(CHAT), 3, **init_args)
    assert len(want) >= 5 and fed == want


def test_hh_strings_a_config_keeps_raw_stay_raw_for_a_chat_policy(tmp_path, fed):
    """``hh_render: never``: the data module keeps the transcripts as strings although the tokenizer has a
    template (``chat_template: auto`` keeps hh_rlhf strings); evaluation's ``auto`` reads them alike."""
    init_args = {"train_path": str(HH_RLHF), "format": "hh_rlhf", "hh_render": "never", "max_records": 12,
                 "val_fraction": 0.25, "max_prompt_length": 1000}  # fmt: skip
    config = fit_config(tmp_path, "PromptDataModule", 5, **init_args)
    data = evaluate(tmp_path, CHAT, "--prompts-config", config)
    assert fed == held_out_ids(PromptDataModule, load_tokenizer(CHAT), 5, **init_args)
    assert all(s["prompt_text"] == s["prompt"] and s["prompt"].startswith("\n\nHuman:") for s in data["samples"])


@pytest.fixture
def no_weights(monkeypatch) -> None:
    """Any model's weights loading fails the test: every bad input is refused before."""

    def refuse(*args, **kwargs):
        raise AssertionError("weights were loaded before the prompts were read")

    monkeypatch.setattr(rlhf_lit.models, "load_causal_lm", refuse)


def test_bad_prompt_sources_are_one_line_naming_the_file_before_any_weights(tmp_path, monkeypatch, no_weights):
    (tmp_path / "x.jsonl.gz").write_text('{"prompt": "a"}\n', encoding="utf-8")
    (tmp_path / "p.jsonl").write_text('{"prompt": "a"}\n{"question": "b"}\n', encoding="utf-8")
    (tmp_path / "good.jsonl").write_text('{"prompt": "a"}\n', encoding="utf-8")
    no_split = fit_config(tmp_path, "PromptDataModule", 1, train_path=str(tmp_path / "good.jsonl"))
    (tmp_path / "nodata.yaml").write_text("model: {class_path: rlhf_lit.stages.PPOModule}\n", encoding="utf-8")
    fake_hub(monkeypatch, {"train": [{"prompt": "a"}], "test": [{"prompt": "b"}]})
    cases = [
        (["--prompts", str(tmp_path / "x.jsonl.gz")], "x.jsonl.gz: not a complete gzip file"),
        (["--prompts", str(tmp_path / "p.jsonl")], "p.jsonl line 2: field 'prompt' missing (record keys: question)"),
        (["--prompts", str(tmp_path / "p.jsonl"), "--prompt-field", "text"], "p.jsonl line 1: field 'text' missing"),
        (["--prompts", "org/prompts", "--prompt-split", "val"],
         "hub dataset 'org/prompts' split 'val': no such split; its splits: train, test"),
        (["--prompts", str(tmp_path / "p.jsonl"), "--max-prompts", "1", "--prompt-format", "alpaca"],
         "p.jsonl line 1: field 'instruction' missing"),
        (["--prompts-config", no_split], "its data module holds out no prompts"),
        (["--prompts-config", str(tmp_path / "nodata.yaml")], "nodata.yaml: no data module (data.class_path)"),
        (["--prompts-config", no_split, "--prompt-split", "test"], "split of config"),
        (["--prompts-config", no_split, "--prompt-format", "hh_rlhf"], "format with config"),
    ]  # fmt: skip
    for options, named in cases:
        result = run_main("evaluate", "--policy", STORIES, *options, cwd=tmp_path)
        assert result.returncode != 0 and named in error_line(result), (options, result.stderr[-2000:])
    read = run_main("evaluate", "--policy", STORIES, "--prompts", "org/prompts", "--prompt-split", "test", cwd=tmp_path)
    assert "weights were loaded before the prompts were read" in read.stderr  # a split it has: read, then loading


def test_a_ppo_run_s_callbacks_read_their_prompt_sources_from_its_config(tmp_path, stories_rm, caplog):
    lines = tmp_path / "held_out.txt"  # a path: jsonargparse must not read it as a sub-config
    lines.write_text("Once upon a time\nThe little dog\nTom\n", encoding="utf-8")
    config = ppo_config(tmp_path, STORIES260K, stories_rm, max_rollouts=2)
    config["trainer"]["callbacks"] += [
        {
            "class_path": "rlhf_lit.callbacks.OverOptimisationGuard",
            "init_args": {"held_out": {"prompts": str(lines), "every_n_rollouts": 1}},
        },
        {
            "class_path": "rlhf_lit.callbacks.OnlineGeneration",
            "init_args": {"every_n_rollouts": 1, "prompts": {"path": str(HH_RLHF), "max_prompts": 2}},
        },
    ]
    with caplog.at_level(logging.INFO):
        result = run_main("fit", "--config", str(write_yaml(tmp_path / "ppo.yaml", config)), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    said = caplog.text  # rank-zero lines: the guard's held-out lines (3), OnlineGeneration's HH prompts (2)
    assert "OnlineGeneration (samples): 3 string prompt(s) kept as plain strings" in said
    assert "OnlineGeneration (samples): 2 string prompt(s) kept as plain strings" in said
    # conversations for a policy without a chat template: refused when fit starts, before any rollout
    messages = tmp_path / "m.jsonl"
    messages.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"}]}) + "\n", encoding="utf-8")
    config["trainer"]["callbacks"][-1]["init_args"]["prompts"] = str(messages)
    config["model"]["init_args"]["export_dir"] = str(tmp_path / "second")
    result = run_main("fit", "--config", str(write_yaml(tmp_path / "ppo.yaml", config)), cwd=tmp_path)
    assert result.returncode != 0 and "has no chat template" in error_line(result)
    assert not (tmp_path / "second").exists()
